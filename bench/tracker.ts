/**
 * In-flight tracker throughput and memory (`npm run bench:tracker`). Pure CPU, no database.
 *
 * With BENCH_ENTRIES entries (default 1,000,000) tracked: insert, touch (deadline change), finish
 * (removal by id), expireDue, and two mixed steady-state workloads (insert + finish + touch a
 * cycle, expireDue every simulated millisecond): acks in push order (a busy group: the ack for
 * the oldest message comes back, locally reordered) and acks for uniformly random messages (the
 * worst case for the caches). Two references in the same run: a plain number[] binary heap, push
 * + pop, no index, no Map (the baseline the ratios use), and a bare Map.get of a random id.
 *
 * Bytes per entry come from heapUsed + arrayBuffers after full GCs, so the script re-runs itself with
 * --expose-gc when `gc` is not available. Each phase runs BENCH_ROUNDS times (default 3); the
 * table shows the median and the best round, because the machine may be shared. Every loop is
 * bounded in count. Exits non-zero only when the run itself fails, never for a missed goal.
 *
 * Environment (all optional): BENCH_ENTRIES=1000000, BENCH_ROUNDS=3, BENCH_SEED=42.
 */
import { spawnSync } from 'node:child_process'
import { cpus, loadavg } from 'node:os'
import { MinHeap } from '../src/dispatch/min-heap.ts'
import { InFlightTracker, TrackerEntry } from '../src/dispatch/tracker.ts'
import { mulberry32 } from '../test/helpers/prng.ts'
import { envInt } from './lib/env.ts'

if (typeof globalThis.gc !== 'function') {
  const child = spawnSync(process.execPath, ['--expose-gc', ...process.execArgv, ...process.argv.slice(1)], { stdio: 'inherit' })
  process.exit(child.status ?? 1)
}
const gc = globalThis.gc as () => void

const N = envInt('BENCH_ENTRIES', 1_000_000)
if (N < 10_000) throw new Error(`BENCH_ENTRIES must be at least 10000, got ${N}`)
const ROUNDS = envInt('BENCH_ROUNDS', 3)
const SEED = envInt('BENCH_SEED', 42)
const GOALS = { mixedOpsPerS: 2_000_000, bytesPerEntry: 150 }
const START_MS = 1_700_000_000_000 // realistic epoch ms: deadlines are doubles, not small integers
const ACK_TIMEOUT_MS = 30_000
const WINDOW_MS = 60_000 // deadlines of the bulk phases spread over one minute
// Mixed phases: the simulated clock moves 1 ms every CYCLES_PER_MS cycles, so a deadline set on
// insert or touch lies 3N cycles ahead. With random acks ~5% of entries expire first (e^-3);
// with acks in push order (each answered ~N cycles after its push) none do.
const CYCLES_PER_MS = Math.max(1, Math.ceil((3 * N) / ACK_TIMEOUT_MS))
const MIXED_CYCLES = N // 3 ops a cycle, plus expireDue (and re-inserts) once per simulated ms
const REORDER = 1024 // acks in push order are shuffled within blocks of this many
const POOL = Math.max(N + (N >> 2), N + 4 * REORDER) // ids for the mixed phases' recycled slots

const unit = mulberry32(SEED)
/** The PRNG's raw 32-bit output (the shared helper scales it to [0, 1)). */
const rand = () => Math.floor(unit() * 4294967296)

/** Delivery ids as the dispatcher makes them: 128 random bits, base64url (22 chars). */
function makeIds(count: number): string[] {
  const bytes = new Uint8Array(16)
  const ids = new Array<string>(count)
  for (let i = 0; i < count; i++) {
    for (let b = 0; b < 16; b += 4) {
      const r = rand()
      bytes[b] = r
      bytes[b + 1] = r >>> 8
      bytes[b + 2] = r >>> 16
      bytes[b + 3] = r >>> 24
    }
    ids[i] = Buffer.from(bytes).toString('base64url')
  }
  return ids
}

function shuffled(count: number): Uint32Array {
  const order = new Uint32Array(count)
  for (let i = 0; i < count; i++) order[i] = i
  for (let i = count - 1; i > 0; i--) {
    const j = rand() % (i + 1)
    const tmp = order[i]!
    order[i] = order[j]!
    order[j] = tmp
  }
  return order
}

function randomDeadlines(count: number): Float64Array {
  const deadlines = new Float64Array(count)
  for (let i = 0; i < count; i++) deadlines[i] = START_MS + (rand() % WINDOW_MS)
  return deadlines
}

function newEntry(deliveryId: string, offset: number, deadlineMs: number): TrackerEntry {
  return new TrackerEntry({ deliveryId, groupId: offset & 7, partition: offset & 15, offset, attempt: 1, deadlineMs })
}

function fill(tracker: InFlightTracker, ids: string[], deadlines: Float64Array, count: number): void {
  for (let i = 0; i < count; i++) tracker.insert(newEntry(ids[i]!, i, deadlines[i]!))
}

/** Runs `body` (which returns how many operations it did) and gives operations per second. */
function timed(body: () => number): number {
  gc()
  const start = process.hrtime.bigint()
  const ops = body()
  const seconds = Number(process.hrtime.bigint() - start) / 1e9
  return ops / seconds
}

// ---- the single-operation phases; each returns ops/s

function insertPhase(ids: string[], deadlines: Float64Array): { opsPerS: number; tracker: InFlightTracker } {
  const tracker = new InFlightTracker()
  const opsPerS = timed(() => {
    fill(tracker, ids, deadlines, N)
    return N
  })
  return { opsPerS, tracker }
}

function touchPhase(tracker: InFlightTracker, ids: string[], order: Uint32Array, deadlines: Float64Array): number {
  return timed(() => {
    let touched = 0
    for (let i = 0; i < N; i++) if (tracker.touch(ids[order[i]!]!, deadlines[i]!)) touched++
    if (touched !== N) throw new Error(`touch hit ${touched} of ${N}`)
    return N
  })
}

function finishPhase(tracker: InFlightTracker, ids: string[], order: Uint32Array): number {
  return timed(() => {
    let finished = 0
    for (let i = 0; i < N; i++) if (tracker.finish(ids[order[i]!]!)) finished++
    if (finished !== N || tracker.size !== 0) throw new Error(`finish removed ${finished} of ${N}`)
    return N
  })
}

/** Entries expired per second, in batches of up to 1000 while the clock sweeps the deadline window. */
function expirePhase(tracker: InFlightTracker): number {
  const stepMs = Math.max(1, Math.round((WINDOW_MS * 1000) / N)) // ~1000 due per call
  return timed(() => {
    let expired = 0
    let nowMs = START_MS
    for (let calls = 0; calls < 4 * N && tracker.size > 0; calls++) {
      nowMs += stepMs
      expired += tracker.expireDue(nowMs, 1000).length
    }
    if (expired !== N) throw new Error(`expireDue returned ${expired} of ${N}`)
    return expired
  })
}

// ---- the mixed phases

interface MixedResult {
  opsPerS: number
  expired: number
  sizeAtEnd: number
}

/**
 * Acks in push order: cycle c inserts message N+c and acks message c (shuffled within blocks of
 * REORDER), and extends a random message still waiting. Message k lives in id slot k % POOL; a
 * slot is reused only after its previous message was acked.
 */
function mixedInOrderPhase(ids: string[]): MixedResult {
  const tracker = new InFlightTracker()
  const reorder = shuffled(REORDER)
  for (let k = 0; k < N; k++) {
    // As if pushed (N - k) cycles before the start: deadlines ascend, the oldest first.
    tracker.insert(newEntry(ids[k]!, k, START_MS + ACK_TIMEOUT_MS - Math.floor((N - k) / CYCLES_PER_MS)))
  }
  let nowMs = START_MS
  let expired = 0
  let ops = 0
  const opsPerS = timed(() => {
    for (let cycle = 0; cycle < MIXED_CYCLES; cycle++) {
      const pushed = N + cycle
      tracker.insert(newEntry(ids[pushed % POOL]!, pushed, nowMs + ACK_TIMEOUT_MS))
      const acked = cycle - (cycle % REORDER) + reorder[cycle % REORDER]!
      if (!tracker.finish(ids[acked % POOL]!)) throw new Error(`message ${acked} was not tracked`)
      const extended = cycle + REORDER + (rand() % (N - REORDER))
      tracker.touch(ids[extended % POOL]!, nowMs + ACK_TIMEOUT_MS)
      ops += 3
      if (cycle % CYCLES_PER_MS === 0) {
        nowMs++
        expired += tracker.expireDue(nowMs, 1000).length
        ops++
      }
    }
    return ops
  })
  return { opsPerS, expired, sizeAtEnd: tracker.size }
}

/**
 * Acks for random messages: each cycle inserts a new entry, finishes a random tracked one and
 * touches another. An expired entry is pushed again at once under a new id (the dispatcher waits
 * out a retry's backoff first, but in waits.ts, not in the tracker). `live` (swap removal) picks a
 * tracked slot in O(1); a free list recycles slots. Harness work counts against the tracker.
 */
function mixedRandomPhase(ids: string[], deadlines: Float64Array): MixedResult {
  const tracker = new InFlightTracker()
  const live = new Int32Array(POOL)
  const position = new Int32Array(POOL)
  const free = new Int32Array(POOL)
  let liveCount = 0
  let freeCount = 0
  let nowMs = START_MS
  const insertNew = (slot: number, deadlineMs: number) => {
    tracker.insert(newEntry(ids[slot]!, slot, deadlineMs))
    position[slot] = liveCount
    live[liveCount++] = slot
  }
  const dropLive = (slot: number) => {
    const last = live[--liveCount]!
    const at = position[slot]!
    live[at] = last
    position[last] = at
    free[freeCount++] = slot
  }
  for (let slot = 0; slot < N; slot++) insertNew(slot, START_MS + Math.floor(((deadlines[slot]! - START_MS) * ACK_TIMEOUT_MS) / WINDOW_MS))
  for (let slot = POOL - 1; slot >= N; slot--) free[freeCount++] = slot
  let expired = 0
  let ops = 0
  const opsPerS = timed(() => {
    for (let cycle = 0; cycle < MIXED_CYCLES; cycle++) {
      if (freeCount > 0) {
        insertNew(free[--freeCount]!, nowMs + ACK_TIMEOUT_MS)
        ops++
      }
      if (liveCount > 0) {
        const slot = live[rand() % liveCount]!
        tracker.finish(ids[slot]!)
        dropLive(slot)
        ops++
      }
      if (liveCount > 0) {
        tracker.touch(ids[live[rand() % liveCount]!]!, nowMs + ACK_TIMEOUT_MS)
        ops++
      }
      if (cycle % CYCLES_PER_MS === 0) {
        nowMs++
        const due = tracker.expireDue(nowMs, 1000)
        ops++
        for (let i = 0; i < due.length; i++) {
          dropLive(due[i]!.offset) // offset holds the slot here
          if (freeCount > 0) insertNew(free[--freeCount]!, nowMs + ACK_TIMEOUT_MS)
          ops++
        }
        expired += due.length
      }
    }
    return ops
  })
  return { opsPerS, expired, sizeAtEnd: tracker.size }
}

// ---- the references

/** The baseline: a number[] min-heap, push and pop, keys as in the in-order mixed phase. */
function baselinePhase(): number {
  const heap: number[] = []
  const push = (key: number) => {
    let i = heap.length
    heap.push(key)
    while (i > 0) {
      const parent = (i - 1) >> 1
      if (heap[parent]! <= key) break
      heap[i] = heap[parent]!
      i = parent
    }
    heap[i] = key
  }
  const pop = (): number => {
    const top = heap[0]!
    const last = heap.pop()!
    const n = heap.length
    if (n === 0) return top
    let i = 0
    while (2 * i + 1 < n) {
      let child = 2 * i + 1
      if (child + 1 < n && heap[child + 1]! < heap[child]!) child++
      if (last <= heap[child]!) break
      heap[i] = heap[child]!
      i = child
    }
    heap[i] = last
    return top
  }
  for (let k = 0; k < N; k++) push(START_MS + ACK_TIMEOUT_MS - Math.floor((N - k) / CYCLES_PER_MS))
  let nowMs = START_MS
  let sink = 0
  const opsPerS = timed(() => {
    for (let cycle = 0; cycle < MIXED_CYCLES; cycle++) {
      if (cycle % CYCLES_PER_MS === 0) nowMs++
      push(nowMs + ACK_TIMEOUT_MS)
      sink += pop()
    }
    return 2 * MIXED_CYCLES
  })
  if (sink === 0) throw new Error('unreachable: keeps the pops alive')
  return opsPerS
}

/** The floor under any by-id operation with random ids: Map.get alone. */
function mapGetPhase(ids: string[]): number {
  const byId = new Map<string, number>()
  for (let i = 0; i < N; i++) byId.set(ids[i]!, i)
  return timed(() => {
    let found = 0
    for (let i = 0; i < N; i++) if (byId.get(ids[rand() % N]!) !== undefined) found++
    if (found !== N) throw new Error('unreachable')
    return N
  })
}

/** The floor under acks in push order: Map churn alone, set of a new id + get and delete of the oldest (2 ops). */
function mapChurnPhase(ids: string[]): number {
  const byId = new Map<string, number>()
  for (let k = 0; k < N; k++) byId.set(ids[k]!, k)
  return timed(() => {
    for (let cycle = 0; cycle < MIXED_CYCLES; cycle++) {
      const pushed = N + cycle
      byId.set(ids[pushed % POOL]!, pushed)
      const oldest = ids[cycle % POOL]!
      if (byId.get(oldest) === undefined || !byId.delete(oldest)) throw new Error('unreachable')
    }
    return 2 * MIXED_CYCLES
  })
}

// ---- memory

interface Memory {
  filledBytes: number
  churnedBytes: number
  entryBytes: number
  heapBytes: number
  mapBytes: number
  idBytes: number
}

/**
 * heapUsed + arrayBuffers per entry after full GCs: the tracker right after N inserts, then again after N more
 * inserts and N finishes (acks in push order), because a Map that has seen deletes keeps a larger
 * table. Everything measured stays referenced until its reading.
 */
function measureMemory(): Memory {
  const used = () => {
    gc()
    gc()
    const { heapUsed, arrayBuffers } = process.memoryUsage()
    return heapUsed + arrayBuffers // the heap's key array lives in an ArrayBuffer, outside heapUsed
  }
  const start = used()
  const ids = makeIds(N)
  const laterIds = makeIds(N)
  const withIds = used()
  const deadlines = randomDeadlines(N) // its buffer lives outside the JS heap
  let tracker: InFlightTracker | undefined = new InFlightTracker()
  const beforeTracker = used()
  fill(tracker, ids, deadlines, N)
  const filled = used()
  for (let i = 0; i < N; i++) {
    tracker.insert(newEntry(laterIds[i]!, N + i, deadlines[i]! + WINDOW_MS))
    tracker.finish(ids[i]!)
  }
  const churned = used()
  if (tracker.size !== N) throw new Error('unreachable')
  tracker = undefined // released, so that the parts below are measured without it
  // The parts on their own, for the breakdown: entry objects (in a pre-sized array), a heap of them, a Map of them.
  const entries = new Array<TrackerEntry>(N).fill(undefined as unknown as TrackerEntry)
  const beforeEntries = used()
  for (let i = 0; i < N; i++) entries[i] = newEntry(ids[i]!, i, deadlines[i]!)
  const withEntries = used()
  const map = new Map<string, TrackerEntry>()
  for (let i = 0; i < N; i++) map.set(ids[i]!, entries[i]!)
  const withMap = used()
  const heap = new MinHeap<TrackerEntry>()
  for (let i = 0; i < N; i++) heap.push(entries[i]!)
  const withHeap = used()
  if (map.size + heap.size + entries.length !== 3 * N) throw new Error('unreachable')
  return {
    filledBytes: (filled - beforeTracker) / N,
    churnedBytes: (churned - beforeTracker) / N,
    entryBytes: (withEntries - beforeEntries) / N,
    mapBytes: (withMap - withEntries) / N,
    heapBytes: (withHeap - withMap) / N,
    idBytes: (withIds - start) / (2 * N),
  }
}

// ---- reporting

const median = (values: number[]) => [...values].sort((a, b) => a - b)[values.length >> 1]!
const int = (n: number) => Math.round(n).toLocaleString('en-US')

function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)))
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n')
}

const LABELS = {
  insert: 'insert (new entry, Map set, heap push)',
  touch: 'touch (random id, random new deadline)',
  finish: 'finish (random id)',
  expire: 'expireDue (entries, batches of 1000)',
  mixedInOrder: 'mixed, acks in push order',
  mixedRandom: 'mixed, acks for random ids',
  baseline: 'baseline: number[] heap push+pop',
  mapGet: 'reference: Map.get of a random id',
  mapChurn: 'reference: Map set new + get/delete oldest',
} as const
type Phase = keyof typeof LABELS

function main(): void {
  console.log(
    `hookq tracker bench: ${int(N)} entries, ${ROUNDS} rounds, seed ${SEED}, node ${process.version}, ` +
      `${cpus().length} × ${cpus()[0]?.model ?? 'cpu'}, load average ${loadavg()
        .map((l) => l.toFixed(2))
        .join(' ')}`,
  )
  const memory = measureMemory()
  const ids = makeIds(POOL)
  const deadlines = randomDeadlines(N)
  const touchDeadlines = randomDeadlines(N)
  const touchOrder = shuffled(N)
  const finishOrder = shuffled(N)
  const results = Object.fromEntries(Object.keys(LABELS).map((k) => [k, [] as number[]])) as Record<Phase, number[]>
  const mixed: { inOrder?: MixedResult; random?: MixedResult } = {}
  for (let round = 0; round < ROUNDS; round++) {
    const { opsPerS, tracker } = insertPhase(ids, deadlines)
    results.insert.push(opsPerS)
    results.touch.push(touchPhase(tracker, ids, touchOrder, touchDeadlines))
    results.finish.push(finishPhase(tracker, ids, finishOrder))
    fill(tracker, ids, deadlines, N)
    results.expire.push(expirePhase(tracker))
    mixed.inOrder = mixedInOrderPhase(ids)
    results.mixedInOrder.push(mixed.inOrder.opsPerS)
    mixed.random = mixedRandomPhase(ids, deadlines)
    results.mixedRandom.push(mixed.random.opsPerS)
    results.baseline.push(baselinePhase())
    results.mapGet.push(mapGetPhase(ids))
    results.mapChurn.push(mapChurnPhase(ids))
    console.log(
      `round ${round + 1}: ` +
        Object.entries(results)
          .map(([k, v]) => `${k} ${int(v[round]!)}`)
          .join(', '),
    )
  }
  const baseline = median(results.baseline)
  const rows = (Object.keys(LABELS) as Phase[]).map((k) => {
    const med = median(results[k])
    return [LABELS[k], int(med), int(Math.max(...results[k])), (1e9 / med).toFixed(0), (med / baseline).toFixed(2)]
  })
  console.log(`\n${table([`operation, ~${int(N)} tracked`, 'ops/s median', 'ops/s best', 'ns/op', 'vs baseline'], rows)}`)
  console.log(
    `(mixed: a cycle is insert + finish + touch, and expireDue once per simulated ms; last round: ` +
      `in order ${int(mixed.inOrder!.expired)} expired, random ${int(mixed.random!.expired)} expired and were pushed again)\n`,
  )
  console.log(
    table(
      ['memory per entry (heapUsed + arrayBuffers after full GCs)', 'bytes'],
      [
        [`tracker just filled with ${int(N)} entries, without the ids`, memory.filledBytes.toFixed(1)],
        ['  parts measured alone: entry object (7 fields + boxed deadline)', memory.entryBytes.toFixed(1)],
        ['  parts measured alone: Map slot', memory.mapBytes.toFixed(1)],
        ['  parts measured alone: heap slot (entry array + key array)', memory.heapBytes.toFixed(1)],
        [`tracker after ${int(N)} more inserts and finishes (Map grown)`, memory.churnedBytes.toFixed(1)],
        ['delivery id string (22 chars; the caller allocates it)', memory.idBytes.toFixed(1)],
      ],
    ),
  )
  const inOrder = median(results.mixedInOrder)
  const random = median(results.mixedRandom)
  const met = (ok: boolean) => (ok ? 'met' : 'MISSED')
  console.log(
    `\ngoals: mixed ≥ ${int(GOALS.mixedOpsPerS)} ops/s: in push order ${int(inOrder)} (${met(inOrder >= GOALS.mixedOpsPerS)}), ` +
      `random ${int(random)} (${met(random >= GOALS.mixedOpsPerS)}); ≤ ${GOALS.bytesPerEntry} bytes/entry: ` +
      `${memory.filledBytes.toFixed(1)} filled (${met(memory.filledBytes <= GOALS.bytesPerEntry)}), ` +
      `${memory.churnedBytes.toFixed(1)} after churn (${met(memory.churnedBytes <= GOALS.bytesPerEntry)}), ids not counted`,
  )
}

main()
