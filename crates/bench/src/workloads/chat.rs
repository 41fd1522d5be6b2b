//! `chat`: a chat server that had to become a cluster.
//!
//! Rooms are groups of 2–50 members; every user is in 1–5 rooms and holds
//! one live event stream (`/events?kind=message`) the whole run. Users post
//! messages to random rooms of theirs, 0–2 s apart, and now and then join
//! or leave a room (the stream resyncs and keeps delivering). Every member
//! of a room must get every message posted while it is a member, exactly
//! once: the kit counts missed and duplicate deliveries, and times each
//! delivery from the post's commit to its arrival.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use hyper::Method;
use serde_json::{json, Value};

use crate::measure::op_stats;
use crate::server::ProcSampler;
use crate::{Http, Kit, Mark, OpStats, Rng, Step, WorkloadRun};

/// A message as the kit posted it.
struct Posted {
    room: usize,
    /// When the post was sent and when its answer came (the commit lies
    /// between).
    sent: Instant,
    committed: Instant,
}

/// A membership of a user in a room, as the kit changed it: members from
/// `from` (the join answered) until `to` (the leave was sent).
#[derive(Clone, Copy)]
struct Span {
    from: Instant,
    to: Option<Instant>,
}

#[derive(Default)]
struct Ledger {
    posted: HashMap<String, Posted>,
    /// (user, room) → when the user was a member.
    spans: HashMap<(usize, usize), Vec<Span>>,
    /// (user, message) → arrivals.
    arrivals: HashMap<(usize, String), Vec<Instant>>,
    resyncs: u64,
    reconnects: u64,
}

fn name(u: usize) -> String {
    format!("chatter{u}")
}

/// One user: a stream reader and a poster.
#[allow(clippy::too_many_arguments)]
async fn user_loop(
    http: Http,
    token: Arc<String>,
    me: usize,
    prefix: String,
    rooms: Arc<Mutex<BTreeSet<usize>>>,
    all_rooms: usize,
    ledger: Arc<Mutex<Ledger>>,
    posting: Arc<AtomicBool>,
    post_hist: Arc<Mutex<Histogram<u64>>>,
    owner: Arc<String>,
    seq: Arc<AtomicU64>,
) {
    let mut rng = Rng::new(0xC4A7 + me as u64);
    while posting.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.below(2000) as u64)).await;
        if !posting.load(Ordering::Relaxed) {
            break;
        }
        // Now and then, join or leave a room.
        if rng.below(20) == 0 {
            let mine: Vec<usize> = rooms.lock().unwrap().iter().copied().collect();
            if mine.len() > 1 && rng.below(2) == 0 {
                let room = mine[rng.below(mine.len())];
                let at = Instant::now();
                {
                    let mut l = ledger.lock().unwrap();
                    if let Some(s) = l.spans.get_mut(&(me, room)).and_then(|v| v.last_mut()) {
                        s.to = Some(at);
                    }
                }
                rooms.lock().unwrap().remove(&room);
                let path = format!(
                    "/api/v1/groups/{prefix}room{room}/members/user:{}",
                    name(me)
                );
                let _ = http.json(Method::DELETE, &path, Some(&token), None).await;
            } else {
                let room = rng.below(all_rooms);
                if !mine.contains(&room) {
                    let path = format!(
                        "/api/v1/groups/{prefix}room{room}/members/user:{}",
                        name(me)
                    );
                    if let Ok(r) = http.json(Method::PUT, &path, Some(&owner), None).await {
                        if r.status == 204 {
                            let at = Instant::now();
                            ledger
                                .lock()
                                .unwrap()
                                .spans
                                .entry((me, room))
                                .or_default()
                                .push(Span { from: at, to: None });
                            rooms.lock().unwrap().insert(room);
                        }
                    }
                }
            }
            continue;
        }
        let mine: Vec<usize> = rooms.lock().unwrap().iter().copied().collect();
        if mine.is_empty() {
            continue;
        }
        let room = mine[rng.below(mine.len())];
        let id = format!("m{}-{}", me, seq.fetch_add(1, Ordering::Relaxed));
        let body = json!({"kind": "message",
            "properties": {"room": format!("{prefix}room{room}"), "msg": id, "text": "hello"},
            "acl": [{"principal": format!("group:{prefix}room{room}"), "role": "viewer"}]});
        let sent = Instant::now();
        if let Ok(r) = http
            .json(Method::POST, "/api/v1/items", Some(&token), Some(&body))
            .await
        {
            let committed = Instant::now();
            if r.status == 201 {
                post_hist
                    .lock()
                    .unwrap()
                    .saturating_record((committed - sent).as_micros().max(1) as u64);
                ledger.lock().unwrap().posted.insert(
                    id,
                    Posted {
                        room,
                        sent,
                        committed,
                    },
                );
            }
        }
    }
}

/// Reads one user's stream until `stop`, reconnecting from the last event.
async fn reader_loop(
    http: Http,
    token: Arc<String>,
    me: usize,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
    arrived: Arc<AtomicU64>,
    ready: tokio::sync::mpsc::Sender<()>,
) {
    let mut last: Option<String> = None;
    let mut announced = false;
    let mut arrivals: Vec<(String, Instant)> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    while !stop.load(Ordering::Relaxed) {
        let stream = http
            .events("/api/v1/events?kind=message", Some(&token), last.as_deref())
            .await;
        let mut stream = match stream {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                ledger.lock().unwrap().reconnects += 1;
                continue;
            }
        };
        if !announced {
            announced = true;
            let _ = ready.send(()).await;
        }
        // One timer per stream, not one per event: it only looks at `stop`.
        let tick = tokio::time::sleep(Duration::from_millis(250));
        tokio::pin!(tick);
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                _ = &mut tick => {
                    if stop.load(Ordering::Relaxed) {
                        record(&ledger, me, &mut arrivals);
                        return;
                    }
                    tick.as_mut().reset(tokio::time::Instant::now() + Duration::from_millis(250));
                    continue;
                }
            };
            match next {
                Ok(Some(e)) if e.event == "resync" => ledger.lock().unwrap().resyncs += 1,
                Ok(Some(e)) => {
                    let at = Instant::now();
                    if e.id.is_some() {
                        last = e.id.clone();
                    }
                    if let Ok(Delivered { item: Some(item) }) = serde_json::from_str(&e.data) {
                        if let Some(m) = item.properties.msg {
                            if seen.insert(m.clone()) {
                                arrived.fetch_add(1, Ordering::Relaxed);
                            }
                            arrivals.push((m, at));
                        }
                    }
                }
                Ok(None) | Err(_) => {
                    ledger.lock().unwrap().reconnects += 1;
                    break;
                }
            }
        }
    }
    record(&ledger, me, &mut arrivals);
}

/// The one field of a delivered change the kit reads: the message's id.
#[derive(serde::Deserialize)]
struct Delivered {
    item: Option<DeliveredItem>,
}

#[derive(serde::Deserialize)]
struct DeliveredItem {
    properties: DeliveredProperties,
}

#[derive(serde::Deserialize)]
struct DeliveredProperties {
    msg: Option<String>,
}

/// Moves a reader's arrivals into the ledger: once, when it stops, so the
/// readers do not contend for the ledger on every event.
fn record(ledger: &Mutex<Ledger>, me: usize, arrivals: &mut Vec<(String, Instant)>) {
    let mut l = ledger.lock().unwrap();
    for (m, at) in arrivals.drain(..) {
        l.arrivals.entry((me, m)).or_default().push(at);
    }
}

/// Each room's users and when they were members of it.
type Rooms<'a> = HashMap<usize, Vec<(usize, &'a [Span])>>;

fn rooms(ledger: &Ledger) -> Rooms<'_> {
    let mut rooms = Rooms::new();
    for (&(user, room), spans) in &ledger.spans {
        rooms.entry(room).or_default().push((user, spans));
    }
    rooms
}

/// The users who must get a post: members for the whole of it, from before
/// it was sent to after it committed (joins and leaves during it are not
/// counted).
fn recipients<'a>(rooms: &'a Rooms<'_>, p: &'a Posted) -> impl Iterator<Item = usize> + 'a {
    let members = rooms.get(&p.room).map_or(&[][..], Vec::as_slice);
    members.iter().filter_map(move |&(user, spans)| {
        let member = spans
            .iter()
            .any(|s| s.from <= p.sent && s.to.is_none_or(|t| t >= p.committed));
        member.then_some(user)
    })
}

/// Waits for the last deliveries after the posters stopped: until the
/// readers have counted as many messages as there are deliveries to make
/// and nothing arrived for [`QUIET_SHORT`], or nothing arrived for
/// [`QUIET_LONG`], or [`LAST_DELIVERY_WAIT`] passed. A reader counts a
/// message the first time it gets it, but the count still takes in some
/// the tally does not expect (to members who joined or left during a post,
/// or posts whose answer never came), so its reaching the target is a hint,
/// not a proof: hence a quiet spell longer than the feed's lag and a
/// reconnect.
async fn wait_for_deliveries(ledger: &Mutex<Ledger>, arrived: &AtomicU64) {
    let expected: u64 = {
        let l = ledger.lock().unwrap();
        let rooms = rooms(&l);
        l.posted
            .values()
            .map(|p| recipients(&rooms, p).count() as u64)
            .sum()
    };
    let started = Instant::now();
    let (mut last, mut changed) = (arrived.load(Ordering::Relaxed), Instant::now());
    while started.elapsed() < LAST_DELIVERY_WAIT {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = arrived.load(Ordering::Relaxed);
        if now != last {
            (last, changed) = (now, Instant::now());
        }
        let quiet = changed.elapsed();
        if quiet >= QUIET_LONG || (now >= expected && quiet >= QUIET_SHORT) {
            return;
        }
    }
}

/// How long arrivals must stop once they reached the expected count.
const QUIET_SHORT: Duration = Duration::from_secs(2);
/// How long arrivals must stop before the kit gives up on the rest.
const QUIET_LONG: Duration = Duration::from_secs(5);
/// The longest wait for the last deliveries.
const LAST_DELIVERY_WAIT: Duration = Duration::from_secs(30);

/// Deliveries counted against what each member should have got.
struct Tally {
    expected: u64,
    delivered: u64,
    missed: u64,
    duplicates: u64,
    latency: Histogram<u64>,
}

fn tally(ledger: &Ledger) -> Tally {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("bounds");
    let (mut expected, mut delivered, mut missed, mut duplicates) = (0, 0, 0, 0);
    for ((_, msg), arrivals) in &ledger.arrivals {
        duplicates += arrivals.len().saturating_sub(1) as u64;
        if let (Some(p), Some(first)) = (ledger.posted.get(msg), arrivals.first()) {
            let us = first
                .saturating_duration_since(p.committed)
                .as_micros()
                .max(1) as u64;
            latency.saturating_record(us);
        }
    }
    let rooms = rooms(ledger);
    for (msg, p) in &ledger.posted {
        for user in recipients(&rooms, p) {
            expected += 1;
            if ledger.arrivals.contains_key(&(user, msg.clone())) {
                delivered += 1;
            } else {
                missed += 1;
            }
        }
    }
    Tally {
        expected,
        delivered,
        missed,
        duplicates,
        latency,
    }
}

pub async fn run(kit: &Kit) -> Result<WorkloadRun> {
    let sweep: &[usize] = if kit.quick {
        &[10, 50]
    } else {
        &[10, 100, 1_000]
    };
    // The administrator makes the rooms and their memberships (past any
    // one user's hourly allowance of new groups).
    let owner = Arc::new(kit.admin.clone());
    let max_users = *sweep.iter().max().unwrap_or(&10);
    // Users, signed in once.
    let tokens: Vec<Arc<String>> = {
        let http = kit.http.clone();
        let admin = kit.admin.clone();
        kit.load("chat users", max_users, 16, move |u| {
            let (http, admin) = (http.clone(), admin.clone());
            Box::pin(async move {
                let r = http
                    .json(
                        Method::POST,
                        "/api/v1/users",
                        Some(&admin),
                        Some(&json!({"username": name(u), "password": "chatter-password"})),
                    )
                    .await?;
                anyhow::ensure!(r.status == 201 || r.status == 409, "sign-up: {}", r.status);
                Ok(Arc::new(
                    crate::sign_in(&http, &name(u), "chatter-password").await?,
                ))
            })
        })
        .await?
    };
    let mut steps = Vec::new();
    let mut marks = Vec::new();
    let mut figures = Vec::new();
    for (step_no, &n) in sweep.iter().enumerate() {
        let rooms = (n / 8).max(2);
        let mut rng = Rng::new(0x600D + n as u64);
        // Rooms of this step, and memberships: 1–5 rooms a user.
        let mut members: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
        for m in members.iter_mut() {
            for _ in 0..1 + rng.below(5) {
                m.insert(rng.below(rooms));
            }
        }
        for r in 0..rooms {
            let count = members.iter().filter(|m| m.contains(&r)).count();
            for _ in count..2 {
                members[rng.below(n)].insert(r);
            }
        }
        let prefix = format!("s{step_no}");
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let arrived = Arc::new(AtomicU64::new(0));
        {
            let http = kit.http.clone();
            let owner2 = owner.clone();
            let prefix2 = prefix.clone();
            kit.load("rooms", rooms, 16, move |r| {
                let (http, owner, prefix) = (http.clone(), owner2.clone(), prefix2.clone());
                Box::pin(async move {
                    let r = http
                        .json(
                            Method::POST,
                            "/api/v1/groups",
                            Some(&owner),
                            Some(&json!({"id": format!("{prefix}room{r}")})),
                        )
                        .await?;
                    anyhow::ensure!(r.status == 201 || r.status == 409, "room: {}", r.status);
                    Ok(())
                })
            })
            .await?;
        }
        // Memberships are written through the API before streams open; the
        // ledger counts them from now.
        for (u, m) in members.iter().enumerate() {
            for &r in m {
                let path = format!("/api/v1/groups/{prefix}room{r}/members/user:{}", name(u));
                kit.http
                    .expect(Method::PUT, &path, Some(&owner), None, 204)
                    .await?;
                ledger
                    .lock()
                    .unwrap()
                    .spans
                    .entry((u, r))
                    .or_default()
                    .push(Span {
                        from: Instant::now(),
                        to: None,
                    });
            }
        }
        let http = kit.http.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let posting = Arc::new(AtomicBool::new(true));
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(n.max(1));
        let mut readers = Vec::new();
        for (u, token) in tokens.iter().take(n).enumerate() {
            readers.push(tokio::spawn(reader_loop(
                http.clone(),
                token.clone(),
                u,
                ledger.clone(),
                stop.clone(),
                arrived.clone(),
                ready_tx.clone(),
            )));
        }
        for _ in 0..n {
            ready_rx.recv().await;
        }
        // Every stream is open: post.
        let sampler = (!kit.pids.is_empty()).then(|| ProcSampler::start(kit.pids.clone()));
        let post_hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
            1,
            600_000_000,
            3,
        )?));
        let seq = Arc::new(AtomicU64::new(0));
        let mut posters = Vec::new();
        for (u, token) in tokens.iter().take(n).enumerate() {
            let room_ids: BTreeSet<usize> = members[u].clone();
            posters.push(tokio::spawn(user_loop(
                http.clone(),
                token.clone(),
                u,
                prefix.clone(),
                Arc::new(Mutex::new(room_ids)),
                rooms,
                ledger.clone(),
                posting.clone(),
                post_hist.clone(),
                owner.clone(),
                seq.clone(),
            )));
        }
        let seconds = kit.seconds(if kit.quick { 4.0 } else { 20.0 });
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        posting.store(false, Ordering::Relaxed);
        for p in posters {
            let _ = p.await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        wait_for_deliveries(&ledger, &arrived).await;
        let server = sampler.map(ProcSampler::finish);
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            let _ = r.await;
        }
        let ledger = ledger.lock().unwrap();
        let t = tally(&ledger);
        let posts = ledger.posted.len() as f64;
        let mut ops: BTreeMap<String, OpStats> = BTreeMap::new();
        let post_hist = post_hist.lock().unwrap().clone();
        ops.insert("post".into(), op_stats(&post_hist, elapsed));
        ops.insert("delivery".into(), op_stats(&t.latency, elapsed));
        let mut params = BTreeMap::new();
        params.insert("users".to_string(), Value::from(n));
        params.insert("rooms".to_string(), Value::from(rooms));
        params.insert("messages".to_string(), Value::from(posts));
        params.insert("expected_deliveries".to_string(), Value::from(t.expected));
        params.insert("delivered".to_string(), Value::from(t.delivered));
        params.insert("missed".to_string(), Value::from(t.missed));
        params.insert("duplicates".to_string(), Value::from(t.duplicates));
        params.insert("resyncs".to_string(), Value::from(ledger.resyncs));
        params.insert("reconnects".to_string(), Value::from(ledger.reconnects));
        let delivery = ops["delivery"].clone();
        marks.push(Mark {
            what: format!("{n} users: missed / duplicate deliveries"),
            target: "0 / 0".into(),
            tarn: format!(
                "{} / {} (of {} expected)",
                t.missed, t.duplicates, t.expected
            ),
            pass: Some(t.missed == 0 && t.duplicates == 0),
        });
        marks.push(Mark {
            what: format!("{n} users: delivery p50 / p99 (commit to arrival)"),
            target: "p99 ≤ 100 ms".into(),
            tarn: format!("{:.1} / {:.1} ms", delivery.p50_ms, delivery.p99_ms),
            pass: Some(delivery.p99_ms <= 100.0),
        });
        if let Some(s) = &server {
            marks.push(Mark {
                what: format!("{n} users: server resident memory, most"),
                target: "≤ 300 MiB".into(),
                tarn: format!("{:.0} MiB", s.rss_max_mib),
                pass: Some(s.rss_max_mib <= 300.0),
            });
        }
        figures.push(json!({"users": n, "messages_per_second": posts / elapsed,
            "deliveries_per_second": t.delivered as f64 / elapsed}));
        steps.push(Step {
            name: format!("{n} users"),
            params,
            users: n,
            seconds: elapsed,
            ops,
            health: None,
            server,
            transport_errors: BTreeMap::new(),
            slow: Vec::new(),
            all: None,
        });
    }
    Ok(WorkloadRun {
        params: json!({"users": sweep, "rooms": "users / 8, at least 2", "figures": figures}),
        steps,
        marks,
        plots: Vec::new(),
    })
}
