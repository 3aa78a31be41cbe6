/**
 * Reads a V8 .heapprofile (sampled allocations, bench/lib/inspector.ts startHeapSampling) and sums
 * the bytes allocated per message: by the function that allocated, by module, and by the nearest
 * project function on the stack (what under src/ asked for the allocation, in a library or not).
 */
import { readFileSync } from 'node:fs'
import { locate } from './cpuprofile.ts'

interface HeapNode {
  callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number }
  selfSize: number
  children: HeapNode[]
}

export interface AllocationRow {
  name: string
  bytesPerMessage: number
}
export interface AllocationSummary {
  bytesPerMessage: number
  byFunction: AllocationRow[]
  byModule: AllocationRow[]
  bySrcCaller: AllocationRow[]
}

export function summarizeAllocations(file: string, messages: number): AllocationSummary {
  const { head } = JSON.parse(readFileSync(file, 'utf8')) as { head: HeapNode }
  const byFunction = new Map<string, number>()
  const byModule = new Map<string, number>()
  const bySrcCaller = new Map<string, number>()
  let total = 0
  const add = (m: Map<string, number>, k: string, n: number) => m.set(k, (m.get(k) ?? 0) + n)
  const walk = (node: HeapNode, srcCaller: string) => {
    const { functionName, url, lineNumber, columnNumber } = node.callFrame
    const { module, file, line } = locate(url, functionName, lineNumber, columnNumber)
    const name = url === '' ? functionName || '(anonymous)' : `${functionName || '(anonymous)'}  ${file}:${line}`
    const caller = file.startsWith('src/') ? name : srcCaller
    if (node.selfSize > 0) {
      total += node.selfSize
      add(byFunction, name, node.selfSize)
      add(byModule, module, node.selfSize)
      add(bySrcCaller, caller, node.selfSize)
    }
    for (const c of node.children) walk(c, caller)
  }
  walk(head, '(outside src/)')
  const rows = (m: Map<string, number>): AllocationRow[] =>
    [...m].map(([name, bytes]) => ({ name, bytesPerMessage: bytes / messages })).sort((a, b) => b.bytesPerMessage - a.bytesPerMessage)
  return { bytesPerMessage: total / messages, byFunction: rows(byFunction), byModule: rows(byModule), bySrcCaller: rows(bySrcCaller) }
}

/** The summary as text: the top `n` rows of each view, in bytes per message. */
export function formatAllocations(s: AllocationSummary, n: number): string {
  const table = (title: string, rows: AllocationRow[]) =>
    [title, ...rows.slice(0, n).map((r) => `  ${r.bytesPerMessage.toFixed(0).padStart(7)} B  ${r.name}`)].join('\n')
  return [
    `${s.bytesPerMessage.toFixed(0)} bytes allocated per message (sampled; objects collected since included)`,
    table('by allocating function:', s.byFunction),
    table('by module:', s.byModule),
    table('by the nearest src/ function on the stack:', s.bySrcCaller),
  ].join('\n')
}
