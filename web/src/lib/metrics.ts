// Reads the Prometheus text exposition of /metrics into what the health
// page shows.

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export function parseMetrics(text: string): Sample[] {
  const out: Sample[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    if (m[3]) {
      for (const l of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
        labels[l[1]] = l[2].replace(/\\(.)/g, '$1');
      }
    }
    const value = Number(m[4] === '+Inf' ? Infinity : m[4]);
    out.push({ name: m[1], labels, value });
  }
  return out;
}

export function sum(samples: Sample[], name: string, filter: (l: Record<string, string>) => boolean = () => true) {
  return samples.filter((s) => s.name === name && filter(s.labels)).reduce((a, s) => a + s.value, 0);
}

/**
 * A quantile of a histogram summed over every series of `name`: the upper
 * bound of the bucket it falls in (what Prometheus' histogram_quantile
 * interpolates within).
 */
export function quantile(samples: Sample[], name: string, q: number): number | null {
  const buckets = new Map<number, number>();
  for (const s of samples) {
    if (s.name !== `${name}_bucket`) continue;
    const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
    buckets.set(le, (buckets.get(le) ?? 0) + s.value);
  }
  const sorted = [...buckets.entries()].sort((a, b) => a[0] - b[0]);
  const total = sorted.length ? sorted[sorted.length - 1][1] : 0;
  if (!total) return null;
  for (const [le, count] of sorted) {
    if (count >= q * total) return le;
  }
  return null;
}
