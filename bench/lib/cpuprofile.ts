/**
 * Reads a V8 .cpuprofile (node --cpu-prof) and sums self time by function and by module (npm
 * package, project file, Node internal). Self time, not total: it points at where the CPU goes.
 */
import { readFileSync } from 'node:fs'
import { SourceMap } from 'node:module'
import { dirname, resolve } from 'node:path'

interface ProfileNode {
  id: number
  callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number }
  children?: number[]
}
interface Profile {
  nodes: ProfileNode[]
  startTime: number
  endTime: number
  samples: number[]
  timeDeltas: number[]
}

export interface Row {
  name: string
  ms: number
  pct: number
}
export interface ProfileSummary {
  busyMs: number
  idleMs: number
  byFunction: Row[]
  byModule: Row[]
}

/**
 * Source maps of bundled scripts, by path (null: none). `npm start` runs the broker from an esbuild
 * bundle (scripts/server-bundle.mjs) whose map leads each position back to its file under src/.
 */
const maps = new Map<string, SourceMap | null>()
function sourceMapOf(path: string): SourceMap | null {
  let map = maps.get(path)
  if (map === undefined) {
    try {
      map = new SourceMap(JSON.parse(readFileSync(`${path}.map`, 'utf8')))
    } catch {
      map = null
    }
    maps.set(path, map)
  }
  return map
}

/**
 * Where a script lives, short: npm package (and file in it), project-relative path or node: module;
 * and the line (1-based). A position in the broker's bundle is mapped back to its source file.
 */
export function locate(
  url: string,
  functionName: string,
  lineNumber = -1,
  columnNumber = -1,
): { module: string; file: string; line: number } {
  if (url === '') {
    const module = functionName.startsWith('(') ? functionName : '(native)'
    return { module, file: module, line: 0 }
  }
  let path = url.replace(/^file:\/\//, '')
  let line = lineNumber + 1
  if (path.includes('/node_modules/.cache/hookq/') && lineNumber >= 0) {
    const entry = sourceMapOf(path)?.findEntry(lineNumber, Math.max(0, columnNumber))
    if (entry && 'originalSource' in entry && entry.originalSource) {
      path = resolve(dirname(path), entry.originalSource.replace(/^file:\/\//, ''))
      line = entry.originalLine + 1
    }
  }
  const nm = path.lastIndexOf('/node_modules/')
  if (nm >= 0) {
    const file = path.slice(nm + '/node_modules/'.length)
    const parts = file.split('/')
    return { module: parts[0]!.startsWith('@') ? `${parts[0]}/${parts[1]}` : parts[0]!, file, line }
  }
  if (path.startsWith('node:')) return { module: path, file: path, line }
  const src = path.search(/\/(src|bench|test|scripts)\//)
  const file = src >= 0 ? path.slice(src + 1) : path
  return { module: file, file, line }
}

export function summarizeProfile(file: string): ProfileSummary {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as Profile
  const nodes = new Map(profile.nodes.map((n) => [n.id, n]))
  // Sample i lasts until sample i+1: its self time is the next delta (the last one gets none).
  const selfUs = new Map<number, number>()
  for (let i = 0; i < profile.samples.length - 1; i++) {
    const id = profile.samples[i]!
    selfUs.set(id, (selfUs.get(id) ?? 0) + Math.max(0, profile.timeDeltas[i + 1]!))
  }
  const byFunction = new Map<string, number>()
  const byModule = new Map<string, number>()
  let busyUs = 0
  let idleUs = 0
  for (const [id, us] of selfUs) {
    const { functionName, url, lineNumber, columnNumber } = nodes.get(id)!.callFrame
    if (functionName === '(idle)') {
      idleUs += us
      continue
    }
    busyUs += us
    const { module, file, line } = locate(url, functionName, lineNumber, columnNumber)
    // Under tsx, line numbers of project .ts files are those of tsx's output, not of the source.
    const fn = url === '' ? functionName || '(anonymous)' : `${functionName || '(anonymous)'}  ${file}:${line}`
    byFunction.set(fn, (byFunction.get(fn) ?? 0) + us)
    byModule.set(module, (byModule.get(module) ?? 0) + us)
  }
  const rows = (m: Map<string, number>): Row[] =>
    [...m].map(([name, us]) => ({ name, ms: us / 1000, pct: (100 * us) / Math.max(1, busyUs) })).sort((a, b) => b.ms - a.ms)
  return { busyMs: busyUs / 1000, idleMs: idleUs / 1000, byFunction: rows(byFunction), byModule: rows(byModule) }
}

/** The summary as text: the top `n` functions and modules by self time. */
export function formatSummary(s: ProfileSummary, n: number): string {
  const table = (title: string, rows: Row[]) =>
    [title, ...rows.slice(0, n).map((r) => `  ${r.pct.toFixed(1).padStart(5)}%  ${r.ms.toFixed(0).padStart(7)} ms  ${r.name}`)].join('\n')
  return [
    `busy ${(s.busyMs / 1000).toFixed(1)} s, idle ${(s.idleMs / 1000).toFixed(1)} s (start-up included; % of busy time)`,
    table('self time by module:', s.byModule),
    table('self time by function:', s.byFunction),
  ].join('\n')
}

/**
 * Total (inclusive) time of the functions whose file matches `include` (e.g. project files under
 * src/): the time spent in them and in everything they called, each function counted once per
 * sample even when recursive. Shows which of our functions the CPU goes through (the self-time
 * view names the leaves: often undici, pg or V8 internals). Percentages are of busy time.
 */
export function inclusiveTimes(file: string, include: (file: string) => boolean): Row[] {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as Profile
  const parent = new Map<number, number>()
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
  const nodes = new Map(profile.nodes.map((n) => [n.id, n]))
  const keyOf = new Map<number, string | null>()
  const key = (id: number): string | null => {
    let k = keyOf.get(id)
    if (k !== undefined) return k
    const { functionName, url, lineNumber, columnNumber } = nodes.get(id)!.callFrame
    const { file: f, line } = locate(url, functionName, lineNumber, columnNumber)
    k = url !== '' && include(f) ? `${functionName || '(anonymous)'}  ${f}:${line}` : null
    keyOf.set(id, k)
    return k
  }
  const totals = new Map<string, number>()
  let busyUs = 0
  for (let i = 0; i < profile.samples.length - 1; i++) {
    const id = profile.samples[i]!
    const us = Math.max(0, profile.timeDeltas[i + 1]!)
    if (nodes.get(id)!.callFrame.functionName === '(idle)') continue
    busyUs += us
    const seen = new Set<string>()
    for (let n: number | undefined = id; n !== undefined; n = parent.get(n)) {
      const k = key(n)
      if (k !== null && !seen.has(k)) {
        seen.add(k)
        totals.set(k, (totals.get(k) ?? 0) + us)
      }
    }
  }
  return [...totals].map(([name, us]) => ({ name, ms: us / 1000, pct: (100 * us) / Math.max(1, busyUs) })).sort((a, b) => b.ms - a.ms)
}
