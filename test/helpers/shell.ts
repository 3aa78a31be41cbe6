/**
 * For the tests that run a documentation page's shell block as a reader pastes it: the block is
 * taken from the page by its marker comment, its addresses swapped for the test's (each swap must
 * find its text, so a page that drifts fails the test), and run by bash in a process group of its
 * own, whose background jobs (a receiver, a consumer) are killed with it at teardown.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readFile } from 'node:fs/promises'
import net from 'node:net'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import type { TeardownHost } from './db.ts'

const root = fileURLToPath(new URL('../../', import.meta.url))

/** The ```sh block that follows `<!-- marker -->` in `page` (relative to the repository). */
export async function shellBlock(page: string, marker: string): Promise<string> {
  const text = await readFile(path.join(root, page), 'utf8')
  const start = text.indexOf(`<!-- ${marker} -->\n\`\`\`sh\n`)
  if (start < 0) throw new Error(`${page} has no sh block marked <!-- ${marker} -->`)
  const body = text.slice(text.indexOf('```sh\n', start) + 6)
  return body.slice(0, body.indexOf('```\n'))
}

/** `script` with each [from, to] replaced everywhere; throws when a `from` is not in it. */
export function swapped(script: string, swaps: [from: string, to: string][]): string {
  let out = script
  for (const [from, to] of swaps) {
    if (!out.includes(from)) throw new Error(`the block no longer says ${JSON.stringify(from)}`)
    out = out.split(from).join(to)
  }
  return out
}

/** A free TCP port on 127.0.0.1 (free when asked; a reader's fixed port would collide with parallel tests). */
export async function freePort(): Promise<number> {
  const server = net.createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as net.AddressInfo
  await new Promise((resolve) => server.close(resolve))
  return port
}

export interface ShellRun {
  child: ChildProcess
  /** stdout and stderr so far, of bash and of the jobs it left running, interleaved. */
  output(): string
}

/** Runs `script` with bash from the repository's root, with `env` over the test's environment. */
export function runShell(t: TeardownHost, script: string, env: Record<string, string> = {}): ShellRun {
  const child = spawn('bash', ['-e', '-c', script], {
    cwd: root,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env },
  })
  let out = ''
  child.stdout!.on('data', (d) => {
    out += d
  })
  child.stderr!.on('data', (d) => {
    out += d
  })
  t.teardown(() => {
    try {
      process.kill(-child.pid!, 'SIGKILL') // bash and the jobs it started in the background
    } catch {
      // already gone
    }
  })
  return { child, output: () => out }
}
