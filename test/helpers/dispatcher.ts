/**
 * The dispatcher alone, on a clock the test steps (test/dispatch/dispatcher.test.ts and its
 * neighbours): a database of the file's own with its stores and a push agent, and `setup`, which
 * makes each test's topic, group, receiver and dispatcher.
 */
import type { Test } from 'tap'
import { AttemptLog } from '../../src/dispatch/attempt-log.ts'
import { Dispatcher } from '../../src/dispatch/dispatcher.ts'
import { createPushAgent, type PushAgent } from '../../src/dispatch/pusher.ts'
import type { PushLease } from '../../src/dispatch/push-send.ts'
import { GroupService, type GroupInput } from '../../src/service/groups.ts'
import { TopicService } from '../../src/service/topics.ts'
import { openDatabase } from '../../src/store/db.ts'
import { claimPartition } from '../../src/store/membership.ts'
import { appendMessages, type AppendReserver } from '../../src/store/messages.ts'
import { findTopicByName } from '../../src/store/topics.ts'
import { SteppedClock } from './clock.ts'
import { testDatabase } from './db.ts'
import type { Envelope } from './push-group.ts'
import { startReceiver, type Behaviour } from './receiver.ts'
import { waitUntil } from './wait.ts'

/** What decides an append's reservations: the dispatcher, or a test's wrapper of it. */
type Reserver = AppendReserver<ReturnType<Dispatcher['reservationsFor']>[number]>

export async function dispatcherFile(t: Test) {
  const database = await testDatabase(t)
  const db = openDatabase(database.url, database.maxConnections)
  t.teardown(() => db.close())
  const topics = new TopicService(db)
  const groups = new GroupService(db)
  const agent = createPushAgent()
  t.teardown(() => agent.destroy())

  /** A topic of one partition, a group on it, a receiver answering 200, and a dispatcher on a stepped clock. */
  async function setup(
    t: Test,
    name: string,
    group: Omit<GroupInput, 'topic'>,
    opts: {
      disableConsumer?: (id: string, reason: string) => Promise<void>
      lease?: PushLease
      agent?: PushAgent
      behaviour?: Behaviour
      pushWindow?: { initial: number; max: number }
      partitions?: number
      /** The broker's lazy completions (progress.ts lazyMs), on the stepped clock. */
      lazyCompletionMs?: number
    } = {},
  ) {
    await topics.put(name, opts.partitions ?? 1)
    await groups.put(name, { topic: name, ...group })
    const receiver = await startReceiver(t, opts.behaviour)
    // (A pull group has no consumers: its callers take its messages.)
    if (group.delivery !== 'pull') await groups.addConsumer(name, { url: receiver.url })
    const clock = new SteppedClock()
    const attempts = new AttemptLog(db, { flushDelayMs: 1, holdMs: 1000, maxBuffered: 10_000, onError: () => {}, now: clock.now })
    const errors: unknown[] = []
    const dispatcher = new Dispatcher({
      db,
      attempts,
      agent: opts.agent ?? agent,
      now: clock.now,
      timers: clock,
      loadGroup: (n) => groups.load(n),
      loadGroups: () => groups.loadAll(),
      ensureOffsets: async (row, topic) => {
        await groups.ensureOffsets(row, topic.id, topic.partitions)
      },
      disableConsumer: opts.disableConsumer ?? ((id, reason) => groups.disableConsumer(id, reason)),
      log: { warn: () => {}, error: (o) => errors.push(o) },
      ...(opts.lease ? { lease: opts.lease } : {}),
      ...(opts.pushWindow ? { pushWindow: opts.pushWindow } : {}),
      ...(opts.lazyCompletionMs ? { lazyCompletionMs: opts.lazyCompletionMs } : {}),
    })
    t.teardown(async () => {
      await dispatcher.stop()
      await attempts.close()
    })
    await dispatcher.start()
    const topic = (await findTopicByName(db.prisma, name))!
    const groupId = (await groups.load(name))!.row.id
    // This process owns the partition, as src/cluster/ownership.ts would make it: a new epoch, then acquire.
    const own = async (partition = 0) =>
      t.ok(await dispatcher.acquire(name, partition, (await claimPartition(db.pool, groupId, partition))!), 'the partition is acquired')
    await own()
    /**
     * Appends the values (`reserve`: letting the dispatcher reserve first pushes in the append's
     * statement, as the broker's produce does; `keys`: the messages' keys, in order); the messages as
     * produce hands them over, and the end.
     */
    const append = async (
      values: unknown[],
      {
        delayMs = 0,
        partition = 0,
        reserve = false,
        reserver = undefined as Reserver | undefined,
        keys = undefined as (string | null)[] | undefined,
      } = {},
    ) => {
      const entries = values.map((v, i) => ({
        topicId: topic.id,
        partition,
        key: keys?.[i] ?? null,
        value: JSON.stringify(v),
        headers: '{}',
        delayMs,
        idempotencyKey: null,
        traceId: '0af7651916cd43dd8448eb211c80319c',
        traceparent: null,
        tracestate: null,
      }))
      const at = await appendMessages(db, entries, reserve ? (reserver ?? dispatcher) : undefined)
      const messages = at.map((c, i) => {
        const e = entries[i]!
        const producedAtMs = c!.producedAtMs!
        return { ...e, offset: c!.offset, producedAtMs, availableAtMs: producedAtMs + delayMs }
      })
      // The database stamped them with its time: the clock catches up with it first. Not just with
      // Date.now(): a stamp in the same millisecond can read as the next one (microseconds rounded),
      // and a message produced "after" the clock waits for a moment the clock never reaches.
      clock.advance(Math.max(0, Date.now() - clock.nowMs, ...messages.map((m) => m.producedAtMs - clock.nowMs)))
      return { messages, end: at.at(-1)!.offset + 1 }
    }
    /** Appends the values and wakes the dispatcher; `tail`: hands it the messages as the produce path does (no read). */
    const produce = async (values: unknown[], delayMs = 0, partition = 0, tail = false) => {
      const { messages, end } = await append(values, { delayMs, partition })
      dispatcher.notifyAppend(topic.id, partition, end, tail ? messages : undefined)
    }
    const pushes = () => receiver.requests.map((r) => r.json as Envelope)
    /** Waits (in real time) for the n-th push to arrive: the push itself is real HTTP. */
    const pushed = async (n: number) => {
      await receiver.waitFor(n, 10_000)
      return pushes()[n - 1]!
    }
    /** Waits (in real time) until the broker has every push's answer: a nack before it waits for it. */
    const answered = () => waitUntil(() => dispatcher.pushWindows().every((w) => w.inFlight === 0), 10_000, 'every push answered')
    const committed = async () =>
      Number((await db.pool.query('SELECT committed_offset FROM group_offsets WHERE group_id = $1', [groupId])).rows[0].committed_offset)
    const pushedOffset = async () =>
      Number((await db.pool.query('SELECT pushed_offset FROM group_offsets WHERE group_id = $1', [groupId])).rows[0].pushed_offset)
    return {
      clock,
      dispatcher,
      attempts,
      append,
      produce,
      pushes,
      pushed,
      answered,
      committed,
      pushedOffset,
      groupId,
      errors,
      receiver,
      topic,
      own,
    }
  }
  return { db, topics, groups, agent, setup }
}
