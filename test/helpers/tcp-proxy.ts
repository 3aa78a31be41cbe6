/**
 * A loopback TCP proxy that a test can cut and heal, to take the database away from a broker the
 * way a network failure or a server restart does (connections reset, new ones refused).
 */
import net from 'node:net'

export interface TcpProxy {
  port: number
  /** Resets every open connection and refuses new ones. */
  cut(): Promise<void>
  /** Accepts connections again, on the same port. */
  heal(): Promise<void>
  close(): Promise<void>
}

export async function startTcpProxy(targetHost: string, targetPort: number): Promise<TcpProxy> {
  const sockets = new Set<net.Socket>()
  const server = net.createServer((client) => {
    const upstream = net.connect(targetPort, targetHost)
    for (const s of [client, upstream]) {
      sockets.add(s)
      s.on('close', () => sockets.delete(s))
      s.on('error', () => { client.destroy(); upstream.destroy() })
    }
    client.pipe(upstream)
    upstream.pipe(client)
  })
  const listen = (port: number) => new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, '127.0.0.1', () => { server.off('error', reject); resolve() })
  })
  await listen(0)
  const port = (server.address() as net.AddressInfo).port
  const stop = () => new Promise<void>((resolve) => {
    for (const s of sockets) s.resetAndDestroy()
    if (server.listening) server.close(() => resolve())
    else resolve()
  })
  return { port, cut: stop, heal: () => listen(port), close: stop }
}
