// Tests of static/qwenweb/shared_stream.js, leader_election.js and shared_feed.js: leader election (Web Locks and the localStorage
// lease) and SharedStream's sharing, handover and detach, with in-memory fakes of the
// browser's BroadcastChannel, Web Locks and localStorage. No test waits on the wall clock:
// timers are injected and fired by hand; `until()` yields to the event loop a bounded
// number of times.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { LeaderElection, electionMode } from "../../static/qwenweb/leader_election.js";
import { SharedFeed } from "../../static/qwenweb/shared_feed.js";
import { SharedStream } from "../../static/qwenweb/shared_stream.js";
import { T, until } from "./timer_support.mjs";

/** BroadcastChannel: messages are structured-cloned to every other open channel of a name. */
function channelHub() {
  const open = new Set();
  return (name) => {
    const channel = {
      name,
      onmessage: null,
      postMessage(message) {
        const copy = structuredClone(message);
        for (const other of open) {
          if (other !== channel && other.name === name) {
            queueMicrotask(() => open.has(other) && other.onmessage && other.onmessage({ data: copy }));
          }
        }
      },
      close() {
        open.delete(channel);
      },
    };
    open.add(channel);
    return channel;
  };
}

/** navigator.locks: exclusive, FIFO, released when the callback's promise settles. */
function fakeLocks() {
  const queues = new Map();
  const next = (name) => {
    const queue = queues.get(name);
    if (queue.held || queue.waiting.length === 0) return;
    const waiter = queue.waiting.shift();
    queue.held = true;
    Promise.resolve(waiter.callback()).finally(() => {
      queue.held = false;
      waiter.resolve();
      next(name);
    });
  };
  return {
    request(name, options, callback) {
      return new Promise((resolve, reject) => {
        if (!queues.has(name)) queues.set(name, { held: false, waiting: [] });
        const queue = queues.get(name);
        const waiter = { callback, resolve };
        queue.waiting.push(waiter);
        options.signal?.addEventListener("abort", () => {
          const index = queue.waiting.indexOf(waiter);
          if (index >= 0) {
            queue.waiting.splice(index, 1);
            reject(new DOMException("aborted", "AbortError"));
          }
        });
        next(name);
      });
    },
  };
}

/** A stand-in for SessionEventStream: records its options; the test emits frames. */
function fakeStreams() {
  const made = [];
  class FakeStream {
    constructor(options) {
      this.options = options;
      this.lastEventId = options.lastEventId;
      this.epoch = options.epoch;
      this.reconnectCount = 0;
      this.retryMs = 3000;
      this.currentDelayMs = null;
      this.calls = [];
      made.push(this);
    }
    start() {
      this.calls.push("start");
      this.options.onStateChange("connecting", { reason: "start" });
      return this;
    }
    open(epoch = "E") {
      this.epoch = epoch;
      this.options.onStateChange("open", { status: 200, epoch });
    }
    emit(id, type = "note", epoch = this.epoch) {
      this.epoch = epoch;
      if (id !== null) this.lastEventId = String(id);
      const data = JSON.stringify({ ...(id === null ? {} : { id }), v: 1, type, data: {} });
      this.options.onEvent({ type, data, json: JSON.parse(data), lastEventId: this.lastEventId, id: id === null ? null : String(id) });
    }
    close() {
      this.calls.push("close");
    }
    drop() {
      this.calls.push("drop");
    }
    pause() {
      this.calls.push("pause");
    }
    resume() {
      this.calls.push("resume");
    }
  }
  return { FakeStream, made };
}

/** One "browser": tabs share a channel hub and a lock manager. */
function browser() {
  const createChannel = channelHub();
  const locks = fakeLocks();
  const { FakeStream, made } = fakeStreams();
  const timers = []; // SharedStream's own timers (the rejoin after Resume), fired by hand
  const tab = (name, extra = {}) => {
    const log = { events: [], states: [], roles: [], waits: [], resyncs: 0 };
    const shared = new SharedStream({
      key: "s1",
      tabId: name,
      streamOptions: { url: "/session/s1/events" },
      StreamClass: FakeStream,
      createChannel,
      createElection: (options) => new LeaderElection({ ...options, mode: "locks", locks }),
      onEvent: (frame) => log.events.push(frame.id === null ? frame.type : Number(frame.id)),
      onStateChange: (state, info) => log.states.push([state, info.reason]),
      onRoleChange: (role, info) => log.roles.push([role, info.reason]),
      onConnectionWait: (waiting) => log.waits.push(waiting),
      onResyncRequired: () => (log.resyncs += 1),
      setTimeout: (fn, ms) => timers.push({ fn, ms }),
      ...extra,
    });
    return { shared, log };
  };
  return { tab, made, timers };
}

describe("electionMode", () => {
  test("Web Locks only in a secure context that has them", T, () => {
    assert.equal(electionMode({ isSecureContext: true, navigator: { locks: {} } }), "locks");
    assert.equal(electionMode({ isSecureContext: false, navigator: {} }), "lease");
    assert.equal(electionMode({ isSecureContext: true, navigator: {} }), "lease");
  });
});

describe("SharedStream over Web Locks", () => {
  test("one stream for three tabs: the first is leader, the others get every frame", T, async () => {
    const b = browser();
    const a = b.tab("a");
    const c = b.tab("c");
    const d = b.tab("d");
    a.shared.start({ lastEventId: "10", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    c.shared.start({ lastEventId: "10", epoch: "E" });
    d.shared.start({ lastEventId: "10", epoch: "E" });
    assert.equal(b.made.length, 1, "one stream in the browser");
    assert.equal(b.made[0].options.lastEventId, "10");
    b.made[0].open();
    for (const id of [11, 12, 13]) b.made[0].emit(id);
    await until(() => c.log.events.length === 3 && d.log.events.length === 3, "followers got the frames");
    assert.deepEqual(c.log.events, [11, 12, 13]);
    assert.deepEqual(d.log.events, [11, 12, 13]);
    assert.equal(c.shared.role, "follower");
    assert.equal(c.shared.lastEventId, "13");
    assert.equal(c.shared.epoch, "E");
    assert.equal(c.shared.state, "open", "the leader's state is mirrored");
    await until(() => a.shared.tabs === 3, "the leader counts the tabs");
    assert.equal(b.made.length, 1);
  });

  test("closing the leader: the next tab resumes from the last id it applied, no gap, no duplicate", T, async () => {
    const b = browser();
    const a = b.tab("a");
    const c = b.tab("c");
    a.shared.start({ lastEventId: "0", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    c.shared.start({ lastEventId: "0", epoch: "E" });
    const first = b.made[0];
    first.open();
    for (const id of [1, 2, 3]) first.emit(id);
    await until(() => c.log.events.length === 3, "c has 1..3");
    a.shared.close();
    assert.deepEqual(first.calls, ["start", "close"]);
    await until(() => c.shared.role === "leader", "c takes over");
    const second = b.made[1];
    assert.equal(second.options.lastEventId, "3", "resumes with the last id");
    assert.equal(second.options.epoch, "E", "and its epoch");
    // The server replays after the cursor: 4, 5 (and a repeat of 3 would be skipped by the page).
    second.open();
    second.emit(null, "replay_complete");
    second.emit(4);
    second.emit(5);
    assert.deepEqual(c.log.events, [1, 2, 3, "replay_complete", 4, 5]);
  });

  test("frames shared before start() are held, and those at or below the snapshot cursor dropped", T, async () => {
    const b = browser();
    const a = b.tab("a");
    a.shared.start({ lastEventId: "0", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    b.made[0].open();
    const late = b.tab("late");
    late.shared.listen(); // joins before its snapshot
    b.made[0].emit(1);
    b.made[0].emit(2);
    b.made[0].emit(3);
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(late.log.events, [], "nothing before start");
    late.shared.start({ lastEventId: "2", epoch: "E" }); // its snapshot had 1..2
    b.made[0].emit(4);
    await until(() => late.log.events.length === 2, "late applied 3 and 4");
    assert.deepEqual(late.log.events, [3, 4]);
  });

  test("a follower skips an id at or below its cursor (two leaders, a replay)", T, async () => {
    const b = browser();
    const a = b.tab("a");
    const c = b.tab("c");
    a.shared.start({ lastEventId: "5", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    c.shared.start({ lastEventId: "5", epoch: "E" });
    b.made[0].open();
    for (const id of [4, 5, 6, 6, 7]) b.made[0].emit(id);
    await until(() => c.log.events.length >= 2, "c got frames");
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(c.log.events, [6, 7]);
  });

  test("state_resync_required reaches every tab's onResyncRequired", T, async () => {
    const b = browser();
    const a = b.tab("a");
    const c = b.tab("c");
    a.shared.start({ lastEventId: "5", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    c.shared.start({ lastEventId: "5", epoch: "E" });
    b.made[0].open();
    b.made[0].emit(null, "state_resync_required");
    await until(() => c.log.resyncs === 1, "c resyncs");
  });

  test("a follower's Pause detaches it onto its own stream from its cursor; the others keep sharing", T, async () => {
    const b = browser();
    const a = b.tab("a");
    const c = b.tab("c");
    const d = b.tab("d");
    a.shared.start({ lastEventId: "0", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    c.shared.start({ lastEventId: "0", epoch: "E" });
    d.shared.start({ lastEventId: "0", epoch: "E" });
    b.made[0].open();
    b.made[0].emit(1);
    await until(() => c.log.events.length === 1, "c has 1");
    c.shared.pause();
    assert.equal(c.shared.role, "own");
    assert.deepEqual(c.log.roles.at(-1), ["own", "pause"]);
    assert.equal(b.made.length, 2);
    assert.equal(b.made[1].options.lastEventId, "1");
    assert.deepEqual(b.made[1].calls, ["pause", "start"], "paused before it starts");
    b.made[0].emit(2);
    await until(() => d.log.events.length === 2, "d still shares");
    assert.deepEqual(c.log.events, [1], "the detached tab no longer follows the leader");
  });

  test("the leader's Drop keeps its stream as its own and hands the sharing to another tab", T, async () => {
    const b = browser();
    const a = b.tab("a");
    const c = b.tab("c");
    a.shared.start({ lastEventId: "0", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    c.shared.start({ lastEventId: "0", epoch: "E" });
    b.made[0].open();
    b.made[0].emit(1);
    await until(() => c.log.events.length === 1, "c has 1");
    a.shared.drop();
    assert.equal(a.shared.role, "own");
    assert.deepEqual(b.made[0].calls, ["start", "drop"], "the same stream, dropped, not closed");
    await until(() => c.shared.role === "leader", "c leads now");
    assert.equal(b.made[1].options.lastEventId, "1");
    b.made[0].emit(2); // a's own stream: not shared any more
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(c.log.events, [1]);
  });

  test("a follower that dropped shares again once its own stream caught up: one stream again", T, async () => {
    const b = browser();
    const a = b.tab("a");
    const c = b.tab("c");
    a.shared.start({ lastEventId: "0", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    c.shared.start({ lastEventId: "0", epoch: "E" });
    b.made[0].open();
    b.made[0].emit(1);
    await until(() => c.log.events.length === 1, "c has 1");
    c.shared.drop();
    const own = b.made[1];
    assert.equal(c.shared.role, "own");
    own.open();
    own.emit(null, "replay_complete"); // its reconnect caught up
    assert.equal(c.shared.role, "electing");
    b.made[0].emit(2);
    await until(() => c.shared.role === "follower", "c follows again");
    assert.deepEqual(own.calls.slice(-1), ["close"], "its own stream ends");
    assert.equal(b.made.length, 2, "no new stream");
    await until(() => a.shared.tabs === 2, "the leader counts it again");
    assert.deepEqual(c.log.events, [1, "replay_complete", 2]);
  });

  test("a lone tab's Pause, Resume and a heartbeat: it leads again with the stream it holds", T, async () => {
    const b = browser();
    const a = b.tab("a");
    a.shared.start({ lastEventId: "0", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    const stream = b.made[0];
    stream.open();
    a.shared.pause();
    assert.equal(a.shared.role, "own");
    stream.options.onComment(""); // a heartbeat while paused: stays apart
    assert.equal(a.shared.role, "own");
    a.shared.resume();
    stream.options.onComment("");
    await until(() => a.shared.role === "leader", "a leads again");
    assert.equal(b.made.length, 1, "the same stream, no new request");
    assert.ok(!stream.calls.includes("close"));
  });

  test("after Resume under steady traffic (no heartbeat) a follower shares again within 5 s", T, async () => {
    const b = browser();
    const a = b.tab("a");
    const c = b.tab("c");
    a.shared.start({ lastEventId: "0", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    c.shared.start({ lastEventId: "0", epoch: "E" });
    b.made[0].open();
    b.made[0].emit(1);
    await until(() => c.log.events.length === 1, "c has 1");
    c.shared.pause();
    const own = b.made[1];
    own.open();
    c.shared.resume();
    own.emit(2);
    assert.equal(c.shared.role, "own");
    const [rejoin] = b.timers;
    assert.equal(rejoin.ms, 5000);
    rejoin.fn();
    b.made[0].emit(3);
    await until(() => c.shared.role === "follower", "c follows again");
    assert.deepEqual(own.calls.slice(-1), ["close"]);
  });

  test("a maxQueued of its own never shares again", T, async () => {
    const b = browser();
    const a = b.tab("a", { own: true });
    a.shared.start({ lastEventId: "3", epoch: "E" });
    b.made[0].open();
    b.made[0].emit(null, "replay_complete");
    b.made[0].options.onComment("");
    assert.equal(a.shared.role, "own");
  });

  test("own: never shares, never elects", T, async () => {
    const b = browser();
    const a = b.tab("a", { own: true });
    a.shared.start({ lastEventId: "3", epoch: "E" });
    assert.equal(a.shared.role, "own");
    assert.equal(a.shared.mode, "none");
    assert.equal(b.made.length, 1);
  });

  test("the leader's connection wait is shown on the followers too", T, async () => {
    const b = browser();
    const a = b.tab("a");
    const c = b.tab("c");
    a.shared.start({ lastEventId: "0", epoch: "E" });
    await until(() => a.shared.role === "leader", "a leads");
    c.shared.start({ lastEventId: "0", epoch: "E" });
    b.made[0].options.onConnectionWait(true, { waitedMs: 5000 });
    await until(() => c.log.waits.length === 1, "c told");
    b.made[0].options.onConnectionWait(false, { waitedMs: 0 });
    await until(() => c.log.waits.length === 2, "c told again");
    assert.deepEqual(c.log.waits, [true, false]);
    assert.deepEqual(a.log.waits, [true, false]);
  });
});

describe("LeaderElection over a localStorage lease (no Web Locks)", () => {
  function leaseWorld() {
    const store = new Map();
    const storage = {
      getItem: (key) => (store.has(key) ? store.get(key) : null),
      setItem: (key, value) => store.set(key, String(value)),
      removeItem: (key) => store.delete(key),
    };
    let now = 1_000_000;
    const timers = [];
    const createChannel = channelHub();
    const make = (tabId, events) =>
      new LeaderElection({
        name: "n",
        tabId,
        mode: "lease",
        storage,
        channel: createChannel("n:election"),
        addStorageListener: () => () => {},
        now: () => now,
        setInterval: () => 0,
        clearInterval: () => {},
        setTimeout: (fn, ms) => timers.push({ fn, ms }),
        onElected: () => events.push(`${tabId} elected`),
        onDeposed: () => events.push(`${tabId} deposed`),
      });
    /** Run the due timers (in order) until none is left. */
    const runTimers = async () => {
      for (let round = 0; round < 20; round += 1) {
        await new Promise((resolve) => setImmediate(resolve)); // deliver channel messages
        if (timers.length === 0) return;
        const due = timers.splice(0);
        for (const timer of due) timer.fn();
      }
      assert.fail("timers kept coming");
    };
    return { store, make, runTimers, advance: (ms) => (now += ms), tick: (election) => election._tick() };
  }

  test("the first tab takes the free lease; a second one waits while it is renewed", T, async () => {
    const w = leaseWorld();
    const events = [];
    const a = w.make("a", events).start();
    await w.runTimers();
    assert.deepEqual(events, ["a elected"]);
    const c = w.make("c", events).start();
    await w.runTimers();
    assert.equal(c.isLeader, false);
    assert.equal(JSON.parse(w.store.get("n:lease")).owner, "a");
    w.advance(1000);
    w.tick(a); // renewal
    w.tick(c);
    await w.runTimers();
    assert.deepEqual(events, ["a elected"]);
  });

  test("resign() frees the lease at once and the waiting tab takes it", T, async () => {
    const w = leaseWorld();
    const events = [];
    const a = w.make("a", events).start();
    await w.runTimers();
    const c = w.make("c", events).start();
    await w.runTimers();
    a.resign();
    assert.equal(w.store.has("n:lease"), false);
    await w.runTimers(); // c hears "resign" and claims
    assert.deepEqual(events, ["a elected", "c elected"]);
    assert.equal(c.isLeader, true);
  });

  test("an expired lease whose holder still answers (a throttled hidden tab) is not taken", T, async () => {
    const w = leaseWorld();
    const events = [];
    w.make("a", events).start();
    await w.runTimers();
    const c = w.make("c", events).start();
    w.advance(10_000); // a's timers did not run: its lease expired
    w.tick(c);
    await w.runTimers(); // c pings, a pongs (and renews)
    assert.deepEqual(events, ["a elected"]);
    assert.equal(JSON.parse(w.store.get("n:lease")).owner, "a");
  });

  test("a dead holder's expired lease is taken after the ping goes unanswered", T, async () => {
    const w = leaseWorld();
    const events = [];
    const a = w.make("a", events).start();
    await w.runTimers();
    a._stopped = true; // the tab died: no resign, no answers
    const c = w.make("c", events).start();
    w.advance(10_000);
    w.tick(c);
    await w.runTimers();
    assert.deepEqual(events, ["a elected", "c elected"]);
  });

  test("two leaders after a race: the larger tab id is deposed", T, async () => {
    const w = leaseWorld();
    const events = [];
    const a = w.make("a", events).start();
    await w.runTimers();
    const z = w.make("z", events);
    z._leader = true; // as if its claim had raced a's
    z._started = true;
    w.tick(z); // z sees a live lease of a smaller id
    assert.deepEqual(events, ["a elected", "z deposed"]);
    assert.equal(a.isLeader, true);
  });
});

describe("LeaderElection without usable storage", () => {
  test("a tab whose localStorage refuses writes leads its own stream instead of waiting forever", T, async () => {
    const events = [];
    const timers = [];
    const election = new LeaderElection({
      name: "n", tabId: "a", mode: "lease",
      storage: { getItem: () => null, setItem: () => { throw new Error("QuotaExceededError"); }, removeItem: () => {} },
      channel: channelHub()("n:election"),
      addStorageListener: () => () => {},
      setInterval: () => 0, clearInterval: () => {},
      setTimeout: (fn) => timers.push(fn),
      onElected: () => events.push("elected"),
    }).start();
    for (const fn of timers.splice(0)) fn();
    assert.deepEqual(events, ["elected"]);
    assert.equal(election.isLeader, true);
  });
});

describe("SharedFeed (the dashboard)", () => {
  test("one EventSource for two dashboard tabs; the follower gets its events; handover opens a new one", T, async () => {
    const createChannel = channelHub();
    const locks = fakeLocks();
    const sources = [];
    const open = () => {
      const listeners = {};
      const source = {
        readyState: 0,
        addEventListener: (type, fn) => ((listeners[type] ??= []).push(fn)),
        close: () => (source.closed = true),
        fire: (type, data) => (listeners[type] ?? []).forEach((fn) => fn({ data })),
        closed: false,
      };
      sources.push(source);
      return source;
    };
    const tab = (tabId) => {
      const got = [];
      const feed = new SharedFeed({
        key: "/feed",
        tabId,
        open,
        events: ["stats"],
        createChannel,
        createElection: (options) => new LeaderElection({ ...options, mode: "locks", locks }),
        onMessage: (type, data) => got.push([type, data]),
      }).start();
      return { feed, got };
    };
    const one = tab("one");
    await until(() => one.feed.role === "leader", "one leads");
    const two = tab("two");
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(sources.length, 1);
    sources[0].fire("stats", "{\"n\":1}");
    await until(() => two.got.length === 1, "two got stats");
    assert.deepEqual(two.got, [["stats", "{\"n\":1}"]]);
    one.feed.close();
    assert.equal(sources[0].closed, true);
    await until(() => two.feed.role === "leader", "two leads");
    assert.equal(sources.length, 2);
    two.feed.close();
  });
});
