/**
 * An indexed binary min-heap keyed by deadline. Every entry stores its own position (`index`),
 * so removing or re-keying an entry found by other means (the tracker's Map) is O(log n) instead
 * of an O(n) search. No clock and no callbacks: the caller compares against its own `nowMs`.
 *
 * The keys are mirrored in a Float64Array beside the entries, so sifting compares neighbouring
 * doubles instead of following two pointers per child (entry, then its boxed double): with
 * 1,000,000 entries that made expireDue ~3× faster for 8-16 bytes per entry
 * (docs/performance.md#the-in-flight-tracker).
 * Sifting moves a "hole" instead of swapping pairs. Among equal keys the order is unspecified.
 */

/** What the heap needs of an entry: its key and a slot where the heap keeps its position. */
export interface HeapEntry {
  /** The key, a deadline in epoch ms. Change it only through {@link MinHeap.update} while the entry is in a heap. */
  deadlineMs: number
  /** Position in the heap, maintained by the heap; -1 when the entry is in no heap. */
  index: number
}

const MIN_CAPACITY = 64

/** Binary min-heap of entries by `deadlineMs`; push, pop, remove and update are O(log n), peek O(1). */
export class MinHeap<T extends HeapEntry> {
  private readonly items: T[] = []
  /** keys[i] === items[i].deadlineMs; grows and shrinks by halves. */
  private keys = new Float64Array(MIN_CAPACITY)

  /** Number of entries in the heap. */
  get size(): number {
    return this.items.length
  }

  /** The entry with the earliest deadline, left in place; undefined when the heap is empty. */
  peek(): T | undefined {
    return this.items[0]
  }

  /** Adds an entry; throws if it is already in a heap (its `index` is not -1). */
  push(entry: T): void {
    if (entry.index !== -1) throw new Error(`heap entry is already in a heap (index ${entry.index})`)
    const n = this.items.length
    if (n === this.keys.length) this.resize(n * 2)
    this.items.push(entry)
    this.up(entry, entry.deadlineMs, n)
  }

  /** Removes and returns the entry with the earliest deadline; undefined when the heap is empty. */
  pop(): T | undefined {
    const top = this.items[0]
    if (top !== undefined) this.removeAt(top, 0)
    return top
  }

  /** Removes an entry from anywhere in the heap; false (and nothing changes) if it is not in this heap. */
  remove(entry: T): boolean {
    if (!this.contains(entry)) return false
    this.removeAt(entry, entry.index)
    return true
  }

  /** Changes an entry's deadline and restores the order; throws if the entry is not in this heap. */
  update(entry: T, deadlineMs: number): void {
    if (!this.contains(entry)) throw new Error('heap entry is not in this heap')
    const earlier = deadlineMs < entry.deadlineMs
    entry.deadlineMs = deadlineMs
    if (earlier) this.up(entry, deadlineMs, entry.index)
    else this.down(entry, deadlineMs, entry.index)
  }

  /** True when the entry is in this heap (not merely in some heap). */
  contains(entry: T): boolean {
    const i = entry.index
    return i >= 0 && i < this.items.length && this.items[i] === entry
  }

  /** Empties the heap, marking every entry as in no heap. O(n). */
  clear(): void {
    for (const entry of this.items) entry.index = -1
    this.items.length = 0
    this.keys = new Float64Array(MIN_CAPACITY)
  }

  /** Throws with a description when the order, an index or a mirrored key is wrong. O(n): for tests and debugging. */
  checkInvariant(): void {
    const { items, keys } = this
    for (let i = 0; i < items.length; i++) {
      const entry = items[i]!
      if (entry.index !== i) throw new Error(`heap entry at ${i} says index ${entry.index}`)
      if (keys[i] !== entry.deadlineMs) throw new Error(`heap key at ${i} is ${keys[i]}, entry says ${entry.deadlineMs}`)
      if (i > 0 && keys[(i - 1) >> 1]! > keys[i]!)
        throw new Error(`heap order broken at ${i}: parent ${keys[(i - 1) >> 1]} > child ${keys[i]}`)
    }
  }

  private removeAt(entry: T, i: number): void {
    const items = this.items
    const last = items.pop()!
    const n = items.length
    if (last !== entry) {
      // The last entry fills the hole; it may belong above or below it.
      const key = this.keys[n]!
      if (key < this.keys[i]!) this.up(last, key, i)
      else this.down(last, key, i)
    }
    entry.index = -1
    if (n < this.keys.length >> 2 && this.keys.length > MIN_CAPACITY) this.resize(this.keys.length >> 1)
  }

  private resize(capacity: number): void {
    const keys = new Float64Array(capacity)
    keys.set(this.keys.subarray(0, this.items.length))
    this.keys = keys
  }

  /** Moves `entry` (key `key`) from hole `i` towards the root until its parent is not later. */
  private up(entry: T, key: number, i: number): void {
    const { items, keys } = this
    while (i > 0) {
      const parentIndex = (i - 1) >> 1
      const parentKey = keys[parentIndex]!
      if (parentKey <= key) break
      const parent = items[parentIndex]!
      items[i] = parent
      keys[i] = parentKey
      parent.index = i
      i = parentIndex
    }
    items[i] = entry
    keys[i] = key
    entry.index = i
  }

  /** Moves `entry` (key `key`) from hole `i` towards the leaves until no child is earlier. */
  private down(entry: T, key: number, i: number): void {
    const { items, keys } = this
    const n = items.length
    const firstLeaf = n >> 1
    while (i < firstLeaf) {
      let childIndex = 2 * i + 1
      let childKey = keys[childIndex]!
      if (childIndex + 1 < n && keys[childIndex + 1]! < childKey) childKey = keys[++childIndex]!
      if (key <= childKey) break
      const child = items[childIndex]!
      items[i] = child
      keys[i] = childKey
      child.index = i
      i = childIndex
    }
    items[i] = entry
    keys[i] = key
    entry.index = i
  }
}
