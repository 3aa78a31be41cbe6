/**
 * An indexed binary min-heap keyed by deadline. Every entry stores its own position (`index`),
 * so removing or re-keying an entry found by other means (the tracker's Map) is O(log n) instead
 * of an O(n) search. No clock and no callbacks: the caller compares against its own `nowMs`.
 *
 * Sifting moves a "hole" instead of swapping pairs, so each level costs one array write and one
 * index write. Among equal deadlines the order is unspecified (a binary heap is not stable).
 */

/** What the heap needs of an entry: its key and a slot where the heap keeps its position. */
export interface HeapEntry {
  /** The key, a deadline in epoch ms. Change it only through {@link MinHeap.update} while the entry is in a heap. */
  deadlineMs: number
  /** Position in the heap's array, maintained by the heap; -1 when the entry is in no heap. */
  index: number
}

/** Binary min-heap of entries by `deadlineMs`; push, pop, remove and update are O(log n), peek O(1). */
export class MinHeap<T extends HeapEntry> {
  private readonly items: T[] = []

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
    this.items.push(entry)
    this.up(entry, this.items.length - 1)
  }

  /** Removes and returns the entry with the earliest deadline; undefined when the heap is empty. */
  pop(): T | undefined {
    const items = this.items
    const top = items[0]
    if (top === undefined) return undefined
    const last = items.pop()!
    if (last !== top) this.down(last, 0)
    top.index = -1
    return top
  }

  /** Removes an entry from anywhere in the heap; false (and nothing changes) if it is not in this heap. */
  remove(entry: T): boolean {
    if (!this.contains(entry)) return false
    const i = entry.index
    const last = this.items.pop()!
    if (last !== entry) {
      // The last entry fills the hole; it may belong above or below it.
      if (last.deadlineMs < entry.deadlineMs) this.up(last, i)
      else this.down(last, i)
    }
    entry.index = -1
    return true
  }

  /** Changes an entry's deadline and restores the order; throws if the entry is not in this heap. */
  update(entry: T, deadlineMs: number): void {
    if (!this.contains(entry)) throw new Error('heap entry is not in this heap')
    const earlier = deadlineMs < entry.deadlineMs
    entry.deadlineMs = deadlineMs
    if (earlier) this.up(entry, entry.index)
    else this.down(entry, entry.index)
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
  }

  /** Throws with a description when the heap order or an index is wrong. O(n): for tests and debugging. */
  checkInvariant(): void {
    const items = this.items
    for (let i = 0; i < items.length; i++) {
      const entry = items[i]!
      if (entry.index !== i) throw new Error(`heap entry at ${i} says index ${entry.index}`)
      if (i === 0) continue
      const parent = items[(i - 1) >> 1]!
      if (parent.deadlineMs > entry.deadlineMs) {
        throw new Error(`heap order broken at ${i}: parent ${parent.deadlineMs} > child ${entry.deadlineMs}`)
      }
    }
  }

  /** Moves `entry` from hole `i` towards the root until its parent is not later. */
  private up(entry: T, i: number): void {
    const items = this.items
    const deadlineMs = entry.deadlineMs
    while (i > 0) {
      const parentIndex = (i - 1) >> 1
      const parent = items[parentIndex]!
      if (parent.deadlineMs <= deadlineMs) break
      items[i] = parent
      parent.index = i
      i = parentIndex
    }
    items[i] = entry
    entry.index = i
  }

  /** Moves `entry` from hole `i` towards the leaves until no child is earlier. */
  private down(entry: T, i: number): void {
    const items = this.items
    const n = items.length
    const deadlineMs = entry.deadlineMs
    const firstLeaf = n >> 1
    while (i < firstLeaf) {
      let childIndex = 2 * i + 1
      let child = items[childIndex]!
      if (childIndex + 1 < n) {
        const right = items[childIndex + 1]!
        if (right.deadlineMs < child.deadlineMs) {
          childIndex++
          child = right
        }
      }
      if (deadlineMs <= child.deadlineMs) break
      items[i] = child
      child.index = i
      i = childIndex
    }
    items[i] = entry
    entry.index = i
  }
}
