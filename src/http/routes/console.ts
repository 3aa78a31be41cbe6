/**
 * The web console: static files from src/console at /console/, and uPlot (the chart library) from
 * its package at /console/vendor/. The console is a client of the public /v1 API like any other
 * (it sends the API key itself), so these routes are open and carry no data.
 *
 * Every console response gets a strict Content-Security-Policy: scripts, styles and fetches only
 * from this origin, no inline script or style, no framing. The console writes data with
 * textContent only; the policy is the second line of defence should that ever slip.
 *
 * Both static registrations hide their routes from @fastify/swagger (schemaHide), and so does the
 * /console redirect, so openapi/openapi.json does not change.
 */
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import fastifyStatic from '@fastify/static'
import type { FastifyPluginAsync } from 'fastify'

/** The header every console response carries. */
export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "font-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ')

const CONSOLE_DIR = fileURLToPath(new URL('../../console/', import.meta.url))
// Resolved through Node so a hoisted or nested node_modules both work.
const UPLOT_DIR = path.dirname(createRequire(import.meta.url).resolve('uplot'))

// Only the page's own kinds of file are served: src/console also holds a tsconfig.json and a .d.ts
// that exist for type checking only.
const SERVED = /\.(html|js|css|svg)$/
const VENDOR_FILES = new Set(['/uPlot.esm.js', '/uPlot.min.css'])

/** Serves the console at /console/ (and redirects /console there). */
export function consoleRoutes(): FastifyPluginAsync {
  return async (app) => {
    // Registered inside this plugin, the hook applies to the console's routes only.
    app.addHook('onSend', async (_req, reply) => {
      reply.header('content-security-policy', CONSOLE_CSP)
      reply.header('x-content-type-options', 'nosniff')
      reply.header('referrer-policy', 'no-referrer')
    })

    await app.register(fastifyStatic, {
      root: CONSOLE_DIR,
      prefix: '/console/',
      decorateReply: false,
      schemaHide: true,
      index: ['index.html'],
      allowedPath: (pathname) => pathname === '/' || SERVED.test(pathname),
    })
    await app.register(fastifyStatic, {
      root: UPLOT_DIR,
      prefix: '/console/vendor/',
      decorateReply: false,
      schemaHide: true,
      index: false,
      allowedPath: (pathname) => VENDOR_FILES.has(pathname),
    })

    // Relative URLs in the page (./app.js) need the trailing slash.
    app.get('/console', { schema: { hide: true } }, async (_req, reply) => reply.redirect('/console/', 301))
  }
}
