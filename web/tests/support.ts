// What every browser test shares: a server's URL, people signing up and
// in as a person would, an accessibility scan and a screenshot of each
// page, and a watch for Content-Security-Policy violations.
import AxeBuilder from '@axe-core/playwright';
import { test as base, expect, type Browser, type BrowserContext, type Page } from '@playwright/test';
import { mkdirSync } from 'node:fs';
import { resolve } from 'node:path';

export { expect };

export const SCREENSHOTS = resolve(import.meta.dirname, '../test-results/screenshots');
mkdirSync(SCREENSHOTS, { recursive: true });

export function url(): string {
  const u = process.env.TARN_URL;
  if (!u) throw new Error('TARN_URL is not set: run through playwright test (global setup starts tarn)');
  return u;
}

/** A page that records every CSP violation it sees. */
export async function personPage(context: BrowserContext): Promise<Page> {
  await context.addInitScript(() => {
    const w = window as unknown as { __csp: string[] };
    w.__csp = [];
    document.addEventListener('securitypolicyviolation', (e) => {
      w.__csp.push(`${e.violatedDirective} ${e.blockedURI}`);
    });
  });
  const page = await context.newPage();
  const violations: string[] = [];
  page.on('console', (m) => {
    if (/Content.Security.Policy/i.test(m.text())) violations.push(m.text());
  });
  (page as Page & { cspViolations: string[] }).cspViolations = violations;
  return page;
}

/** Every CSP violation a page reported (console and DOM events). */
export async function cspViolations(page: Page): Promise<string[]> {
  const fromDom = await page.evaluate(() => (window as unknown as { __csp?: string[] }).__csp ?? []).catch(() => []);
  return [...((page as Page & { cspViolations?: string[] }).cspViolations ?? []), ...fromDom];
}

export interface Person {
  name: string;
  password: string;
  context: BrowserContext;
  page: Page;
}

export async function newPerson(browser: Browser, name: string, password = `${name}-secret-pw`): Promise<Person> {
  const context = await browser.newContext({ baseURL: url() });
  const page = await personPage(context);
  return { name, password, context, page };
}

/** Signs up through the sign-up page (which signs in). */
export async function signUp(p: Person) {
  await p.page.goto('/signup');
  await p.page.getByLabel('Username').fill(p.name);
  await p.page.getByLabel('Password').fill(p.password);
  await p.page.getByRole('button', { name: 'Create account' }).click();
  await expect(p.page.getByRole('heading', { level: 1, name: 'My items' })).toBeVisible();
}

/** Signs in through the page `/` shows a visitor. */
export async function signIn(p: Person) {
  await p.page.goto('/');
  await p.page.getByLabel('Username').fill(p.name);
  await p.page.getByLabel('Password').fill(p.password);
  await p.page.getByRole('button', { name: 'Sign in' }).click();
  await expect(p.page.getByRole('button', { name: 'Sign out' })).toBeVisible();
}

/** Follows a link of the main navigation (no reload). */
export async function navigate(page: Page, name: string) {
  await page.getByRole('navigation').getByRole('link', { name, exact: true }).click();
  await expect(page.getByRole('heading', { level: 1 })).toBeVisible();
}

/**
 * Checks a page as it stands: no serious or critical accessibility
 * violation (axe-core, WCAG 2.1 A and AA rules) and no CSP violation; and
 * keeps a screenshot of it under test-results/screenshots.
 */
export async function check(page: Page, name: string) {
  await page.screenshot({ path: `${SCREENSHOTS}/${name}.png`, fullPage: true });
  const result = await new AxeBuilder({ page }).withTags(['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']).analyze();
  const bad = result.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.id} (${v.impact}): ${v.help} — ${v.nodes.map((n) => n.target.join(' ')).join('; ')}`);
  expect(bad, `accessibility violations on ${name}`).toEqual([]);
  expect(await cspViolations(page), `CSP violations on ${name}`).toEqual([]);
}

/** Marks the page so that a later check can tell it was not reloaded. */
export async function markNoReload(page: Page) {
  await page.evaluate(() => ((window as unknown as { __notReloaded: boolean }).__notReloaded = true));
}

export async function expectNotReloaded(page: Page) {
  expect(await page.evaluate(() => (window as unknown as { __notReloaded?: boolean }).__notReloaded)).toBe(true);
}

export const test = base;
