/**
 * A loopback TCP proxy that a test can cut and heal, to take the database away from a broker the
 * way a network failure or a server restart does (connections reset, new ones refused), or silence,
 * the way a partition or a frozen VM does (nothing reset, nothing answered: only timeouts tell).
 */
import net from 'node:net'

export interface TcpProxy {
  port: number
  /** Resets every open connection and refuses new ones. */
  cut(): Promise<void>
  /** Stops forwarding in both directions, closing nothing; new connections are accepted and go nowhere too. */
  silence(): void
  /** Accepts connections again, on the same port. */
  heal(): Promise<void>
  close(): Promise<void>
}

export async function startTcpProxy(targetHost: string, targetPort: number): Promise<TcpProxy> {
  const sockets = new Set<net.Socket>()
  let silent = false
  const server = net.createServer((client) => {
    const upstream = net.connect(targetPort, targetHost)
    for (const s of [client, upstream]) {
      sockets.add(s)
      s.on('close', () => sockets.delete(s))
      s.on('error', () => {
        client.destroy()
        upstream.destroy()
      })
    }
    // Not pipe(): a silenced proxy drops bytes instead of closing, and a close is not passed on.
    client.on('data', (d) => {
      if (!silent) upstream.write(d)
    })
    upstream.on('data', (d) => {
      if (!silent) client.write(d)
    })
    client.on('end', () => {
      if (!silent) upstream.end()
    })
    upstream.on('end', () => {
      if (!silent) client.end()
    })
  })
  const listen = (port: number) =>
    new Promise<void>((resolve, reject) => {
      server.once('error', reject)
      server.listen(port, '127.0.0.1', () => {
        server.off('error', reject)
        resolve()
      })
    })
  await listen(0)
  const port = (server.address() as net.AddressInfo).port
  const stop = () =>
    new Promise<void>((resolve) => {
      for (const s of sockets) s.resetAndDestroy()
      if (server.listening) server.close(() => resolve())
      else resolve()
    })
  return {
    port,
    cut: stop,
    silence: () => {
      silent = true
    },
    heal: () => {
      silent = false
      return listen(port)
    },
    close: stop,
  }
}
