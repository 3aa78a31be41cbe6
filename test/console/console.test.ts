/**
 * The web console end to end: a real broker, real webhook receivers, and the page in a real
 * headless Chromium (Debian's `chromium`, driven by playwright-core). The page must load under its
 * Content-Security-Policy without console errors, show a topic's end offsets and a paused group's
 * lag as the test created them, seek, replay a dead letter exactly once, and ask for the API key
 * when keys are configured.
 *
 * Without /usr/bin/chromium (or HOOKQ_CHROMIUM) the browser tests are skipped, saying why, so a
 * fresh `npm test` passes; where the browser is required (HOOKQ_REQUIRE_BROWSER=1, which .ci/run
 * sets after installing it, or CI=true) a missing one FAILS. HOOKQ_SKIP_BROWSER=1 skips them on
 * purpose. HOOKQ_CONSOLE_SCREENSHOT=docs/console.png also writes the README's screenshot of a busy group.
 */
import { existsSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import { chromium, type BrowserContext, type Page } from 'playwright-core'
import { createClient, unwrap } from '@hookq/client'
import { startBroker, startListeningBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const CHROMIUM = process.env.HOOKQ_CHROMIUM ?? '/usr/bin/chromium'
// Without the background-networking flags, Chromium keeps trying to reach Google's services,
// which a closed network turns into stalls.
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]
// A failure bound, not a pace: on a loaded 2-core CI machine Chromium took over 15 s to render
// Swagger UI's bundle (CI failed on it), so waits give it a minute; the file's own timeout follows.
const WAIT_MS = 60_000
t.setTimeout(900_000)

type Client = ReturnType<typeof createClient>

t.test("the console routes: CSP, redirect, only the page's own files", async (t) => {
  const broker = await startBroker(t)
  const page = await broker.app.inject({ method: 'GET', url: '/console/' })
  t.equal(page.statusCode, 200)
  t.match(page.headers['content-type'], /text\/html/)
  t.match(page.headers['content-security-policy'], /script-src 'self'/)
  t.notMatch(page.headers['content-security-policy'], /unsafe-inline|unsafe-eval/)
  t.match(page.body, /<title>hookq console<\/title>/)

  const redirect = await broker.app.inject({ method: 'GET', url: '/console' })
  t.equal(redirect.statusCode, 301)
  t.equal(redirect.headers.location, '/console/')

  const uplot = await broker.app.inject({ method: 'GET', url: '/console/vendor/uPlot.esm.js' })
  t.equal(uplot.statusCode, 200)
  t.match(uplot.headers['content-type'], /javascript/)
  t.match(uplot.headers['content-security-policy'], /script-src 'self'/)

  for (const url of ['/console/tsconfig.json', '/console/vendor/uPlot.esm.d.ts', '/console/vendor/package.json', '/console/../app.ts']) {
    t.equal((await broker.app.inject({ method: 'GET', url })).statusCode, 404, `${url} is not served`)
  }
  const spec = (await broker.app.inject({ method: 'GET', url: '/openapi.json' })).json() as { paths: Record<string, unknown> }
  t.same(
    Object.keys(spec.paths).filter((p) => p.startsWith('/console')),
    [],
    'the console is not in the OpenAPI document',
  )
})

// A newcomer's machine may have no browser: skip there, saying how to run it. Where the browser
// is required (CI), a missing one is a failure, never a quiet pass.
const requireBrowser = process.env.HOOKQ_REQUIRE_BROWSER === '1' || process.env.CI === 'true'
const missingBrowser =
  `${CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium) or set ` +
  "HOOKQ_CHROMIUM to a Chromium binary to run the console's browser tests"
const skipBrowser =
  process.env.HOOKQ_SKIP_BROWSER === '1'
    ? 'HOOKQ_SKIP_BROWSER=1'
    : !requireBrowser && !existsSync(CHROMIUM)
      ? `${missingBrowser} (required where HOOKQ_REQUIRE_BROWSER=1 or CI=true)`
      : false
t.test('in a headless Chromium', { skip: skipBrowser }, async (t) => {
  if (!existsSync(CHROMIUM)) {
    t.fail(`${missingBrowser} (.ci/run installs it); HOOKQ_REQUIRE_BROWSER=1 or CI=true requires it`)
    return
  }
  await browserTests(t)
})

/** Collects what the page reports as errors: console.error, failed loads, uncaught exceptions. */
function watchErrors(page: Page): string[] {
  const errors: string[] = []
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text())
  })
  page.on('pageerror', (e) => errors.push(`uncaught: ${e.message}`))
  return errors
}

/** Waits until the first element matching `selector` has exactly `text` as its trimmed text. */
async function waitForText(page: Page, selector: string, text: string): Promise<void> {
  let seen: string | null = null
  await waitUntil(
    async () => {
      seen = await page
        .locator(selector)
        .first()
        .textContent({ timeout: 250 })
        .catch(() => null)
      return seen?.trim() === text
    },
    WAIT_MS,
    `${selector} to read ${JSON.stringify(text)}`,
    50,
  ).catch((err: unknown) => {
    throw new Error(`${String(err)}; last seen ${JSON.stringify(seen)}`)
  })
}

async function endOffset(hookq: Client, topic: string, partition: number): Promise<number> {
  const t = await unwrap(hookq.GET('/v1/topics/{topic}', { params: { path: { topic } } }))
  return t.partitionStats.find((p) => p.partition === partition)!.endOffset
}

async function browserTests(t: Test): Promise<void> {
  const profile = await mkdtemp(path.join(os.tmpdir(), 'hookq-console-chromium-'))
  let context: BrowserContext
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      args: CHROMIUM_ARGS,
      headless: true,
      viewport: { width: 1280, height: 900 },
      timeout: 30_000,
    })
  } catch (err) {
    await rm(profile, { recursive: true, force: true })
    throw err
  }
  context.setDefaultTimeout(WAIT_MS)
  t.teardown(async () => {
    await context.close()
    await rm(profile, { recursive: true, force: true })
  })

  const { url } = await startListeningBroker(t)
  const hookq = createClient({ baseUrl: url })

  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'orders' } }, body: { partitions: 2 } }))
  await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', {
      params: { path: { topic: 'orders' } },
      body: {
        messages: [
          { value: { n: 1 }, partition: 0 },
          { value: { n: 2 }, partition: 0 },
          { value: { n: 3 }, partition: 0 },
          // Data that looks like markup must stay text.
          { value: '<img src=x id=injected>', partition: 1, headers: { note: '<b id=injected-header>' } },
        ],
      },
    }),
  )

  t.test('the page loads and lists a topic with its end offsets', async (t) => {
    const page = await context.newPage()
    t.teardown(() => page.close())
    const errors = watchErrors(page)
    const res = await page.goto(`${url}/console`)
    t.equal(res?.status(), 200)
    t.equal(page.url(), `${url}/console/`, 'redirected to the trailing slash')
    t.match(res?.headers()['content-security-policy'], /script-src 'self'/)
    t.equal(await page.title(), 'hookq console')

    await waitForText(page, 'tr[data-topic="orders"] td.end-offsets', 'p0 3 · p1 1')
    await waitForText(page, 'tr[data-topic="orders"] td.total', '4')

    // The topic's page shows partition 0's messages, then partition 1's markup-looking one as text.
    await page.click('tr[data-topic="orders"] a')
    await waitForText(page, 'table.partitions tr[data-partition="1"] td:nth-child(3)', '1')
    await waitForText(page, 'table.partitions tr[data-partition="1"] td:nth-child(2)', '0')
    t.match(await page.locator('p.storage').textContent(), /^Keeps 4 messages \(oldest .+\) · about [\d.]+ (B|KiB|MiB) on disk$/)
    await page.click('table.partitions tr[data-partition="1"] button')
    await waitForText(page, 'table.message-list tr[data-offset="0"] pre.value', '"<img src=x id=injected>"')
    t.equal(await page.locator('#injected, #injected-header').count(), 0, 'no element made from data')
    t.equal(await page.locator('table.message-list tr[data-offset="0"] td:nth-child(3)').textContent(), '–', 'no key: –, as elsewhere')
    t.same(errors, [], 'no console errors (a CSP violation would be one)')
  })

  t.test('a paused group shows its lag per partition; pause, resume and seek work', async (t) => {
    await unwrap(hookq.PUT('/v1/groups/{group}', { params: { path: { group: 'reporting' } }, body: { topic: 'orders', paused: true } }))
    const page = await context.newPage()
    t.teardown(() => page.close())
    const errors = watchErrors(page)
    await page.goto(`${url}/console/#/groups/reporting`)

    await waitForText(page, 'table.partitions tr[data-partition="0"] td.lag', '3')
    await waitForText(page, 'table.partitions tr[data-partition="1"] td.lag', '1')
    await waitForText(page, 'table.partitions tr[data-partition="0"] td.end', '3')
    await waitForText(page, '.total-lag', 'lag 4')
    t.equal(await page.locator('.chart canvas').count(), 1, 'the lag chart is drawn')
    // Until its second sample a fresh chart says it is collecting them; then the note goes.
    await waitUntil(async () => (await page.locator('.chart-note').textContent())?.trim() === '', WAIT_MS, 'a second sample')

    await page.click('button.pause')
    await waitUntil(
      async () => !(await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group: 'reporting' } } }))).paused,
      WAIT_MS,
      'the group resumed',
    )
    await waitForText(page, 'button.pause', 'Pause')
    await page.click('button.pause')
    await waitUntil(
      async () => (await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group: 'reporting' } } }))).paused,
      WAIT_MS,
      'the group paused again',
    )

    // Seek partition 0 to its end: its lag goes to 0, after a confirmation.
    page.once('dialog', (d) => {
      t.match(d.message(), /partition 0 of group reporting to offset 3/)
      void d.accept()
    })
    await page.selectOption('form.seek select[name="partition"]', '0')
    await page.fill('form.seek input[name="offset"]', '3')
    await page.click('form.seek button[type="submit"]')
    await waitForText(page, 'table.partitions tr[data-partition="0"] td.lag', '0')
    const status = await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group: 'reporting' } } }))
    t.same(
      status.partitions.map((p) => p.committedOffset),
      [3, 0],
    )

    await page.goto(`${url}/console/#/groups`)
    await waitForText(page, 'tr[data-group="reporting"] td.lag', '1')
    t.same(errors, [], 'no console errors')
  })

  t.test('a dead letter is listed and replayed once to its original topic', async (t) => {
    const receiver = await startReceiver(t, { status: 500 })
    await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'payments' } }, body: { partitions: 1 } }))
    await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'payments.dlq' } }, body: { partitions: 1 } }))
    await unwrap(
      hookq.PUT('/v1/groups/{group}', {
        params: { path: { group: 'settle' } },
        body: { topic: 'payments', maxDeliveries: 1, deadLetterTopic: 'payments.dlq', ackMode: 'auto' },
      }),
    )
    await unwrap(
      hookq.POST('/v1/groups/{group}/consumers', { params: { path: { group: 'settle' } }, body: { url: `${receiver.url}/hook` } }),
    )
    await unwrap(
      hookq.POST('/v1/topics/{topic}/messages', {
        params: { path: { topic: 'payments' } },
        body: { messages: [{ value: { amount: 42, memo: '<script>x</script>' }, key: 'acct-7', headers: { source: 'console-test' } }] },
      }),
    )
    await waitUntil(async () => (await endOffset(hookq, 'payments.dlq', 0)) === 1, WAIT_MS, 'the dead letter')
    receiver.setBehaviour({ status: 200 })

    const page = await context.newPage()
    t.teardown(() => page.close())
    const errors = watchErrors(page)
    // The consumer that answered 500 shows as failing on the group page, with its error.
    await page.goto(`${url}/console/#/groups/settle`)
    await waitForText(page, 'table.consumers tr[data-consumer] td.health span.badge', 'failing 100%')
    t.match(await page.locator('table.consumers tr[data-consumer] td.health').textContent(), /last failure .*: HTTP 500/)
    // One consumer, failing: counted once.
    await page.goto(`${url}/console/#/groups`)
    await waitForText(page, 'tr[data-group="settle"] td.consumer-health', '1 consumer, failing')
    // A second group shares the dead-letter topic and has dead-lettered nothing: it is credited with none.
    await unwrap(
      hookq.PUT('/v1/groups/{group}', {
        params: { path: { group: 'settle-audit' } },
        body: { topic: 'payments', deadLetterTopic: 'payments.dlq', paused: true },
      }),
    )
    await page.goto(`${url}/console/#/dead-letters`)
    await waitForText(page, 'tr[data-group="settle"] td.dead-count', '1')
    await waitForText(page, 'tr[data-group="settle-audit"] td.dead-count', '0')
    await page.click('tr[data-group="settle"] a[href$="/dead-letters"]')
    const row = 'table.dead-letters tr[data-dlq-partition="0"][data-dlq-offset="0"]'
    await waitForText(page, `${row} td.original`, 'payments p0 @ 0')
    await waitForText(page, `${row} td.attempts`, '1')
    t.match(await page.locator(`${row} td.error-cell`).textContent(), /500/, 'the last error is shown')
    const columns = await page.evaluate(`(() => {
      const heads = [...document.querySelectorAll('table.dead-letters th')].map((th) => th.textContent)
      const cells = [...document.querySelector('${row}').children]
      return [heads.indexOf('Replay'), cells.findIndex((c) => c.querySelector('button.replay') !== null)]
    })()`)
    t.same(columns, [8, 8], 'the Replay header sits over the Replay buttons')

    await page.click(`${row} button.replay`)
    await waitForText(page, `${row} td.result`, 'replayed → payments p0 @ 1')
    const fetched = await unwrap(
      hookq.GET('/v1/topics/{topic}/partitions/{partition}/messages', {
        params: { path: { topic: 'payments', partition: 0 }, query: { fromOffset: 0, limit: 10 } },
      }),
    )
    t.equal(fetched.messages.length, 2, 'one new message in the original topic')
    t.same(
      fetched.messages[1],
      { ...fetched.messages[0], offset: 1, timestamp: fetched.messages[1]!.timestamp },
      'same key, value and headers, without hookq-dlq-*',
    )

    // Again, and with "replay all": the idempotency key stores nothing new.
    await page.click(`${row} button.replay`)
    await waitForText(page, `${row} td.result`, 'already replayed (payments p0 @ 1)')
    page.once('dialog', (d) => void d.accept())
    await page.reload()
    await page.click('button.replay-all')
    await waitForText(page, `${row} td.result`, 'already replayed (payments p0 @ 1)')
    t.equal(await endOffset(hookq, 'payments', 0), 2, 'no duplicate')

    // The attempt log, filtered to dead outcomes, shows the failed push.
    await page.goto(`${url}/console/#/groups/settle/deliveries?outcome=dead`)
    await waitForText(page, 'table.deliveries tr[data-outcome="dead"] td:nth-child(6)', '500')
    t.equal(await page.locator('table.deliveries tr[data-delivery]').count(), 1)
    t.same(errors, [], 'no console errors')
  })

  t.test('the schedules page lists a schedule with its next run; pause and resume work', async (t) => {
    await unwrap(
      hookq.PUT('/v1/schedules/{name}', {
        params: { path: { name: 'nightly' } },
        body: { topic: 'orders', cron: '30 2 * * *', timeZone: 'Europe/Berlin', message: { value: 1 } },
      }),
    )
    const page = await context.newPage()
    t.teardown(() => page.close())
    const errors = watchErrors(page)
    await page.goto(`${url}/console/#/schedules`)
    await waitForText(page, 'tr[data-schedule="nightly"] td.timing', 'cron 30 2 * * * (Europe/Berlin)')
    t.notMatch(await page.locator('tr[data-schedule="nightly"] td.next-run').textContent(), /paused|–/, 'a next run is shown')
    await page.click('tr[data-schedule="nightly"] button.pause')
    await waitForText(page, 'tr[data-schedule="nightly"] td.next-run', 'paused')
    const paused = await unwrap(hookq.GET('/v1/schedules/{name}', { params: { path: { name: 'nightly' } } }))
    t.match(paused, { paused: true, cron: '30 2 * * *', timeZone: 'Europe/Berlin', message: { value: 1 } }, 'paused, the rest as it was')
    await page.click('tr[data-schedule="nightly"] button.pause')
    await waitForText(page, 'tr[data-schedule="nightly"] button.pause', 'Pause')
    t.same(errors, [], 'no console errors')
  })

  t.test('with API keys the page asks for one, then shows data', async (t) => {
    const key = 'console-test-key-0123456789'
    const secured = await startListeningBroker(t, { HOOKQ_API_KEYS: key })
    const keyed = createClient({ baseUrl: secured.url, apiKey: key })
    await unwrap(keyed.PUT('/v1/topics/{topic}', { params: { path: { topic: 'secured' } }, body: { partitions: 3 } }))

    const page = await context.newPage()
    t.teardown(() => page.close())
    const errors = watchErrors(page)
    await page.goto(`${secured.url}/console/`)
    await page.locator('#key-form').waitFor({ state: 'visible' })
    t.match(await page.locator('main .error').textContent(), /401/)

    await page.fill('#key-input', 'not-the-key')
    await page.click('#key-form button[type="submit"]')
    await waitForText(page, '#key-message', 'The broker refused this API key. Enter another one.')

    await page.fill('#key-input', key)
    await page.click('#key-form button[type="submit"]')
    await waitForText(page, 'tr[data-topic="secured"] td.end-offsets', 'p0 0 · p1 0 · p2 0')
    t.ok(await page.locator('#key-form').isHidden(), 'the form is gone')
    t.equal(await page.evaluate('sessionStorage.getItem("hookq.apiKey")'), key, 'kept in sessionStorage')
    t.same(
      errors.filter((e) => !/status of 401/.test(e)),
      [],
      'no console errors but the refused loads',
    )
  })

  t.test('with a scoped key the page shows what it may see, and a 403 as a message; /docs renders under its CSP', async (t) => {
    const root = 'console-root-key-0123456789'
    const secured = await startListeningBroker(t, { HOOKQ_API_KEYS: root })
    const admin = createClient({ baseUrl: secured.url, apiKey: root })
    for (const topic of ['orders', 'billing', 'billing-dlq']) {
      await unwrap(admin.PUT('/v1/topics/{topic}', { params: { path: { topic } }, body: { partitions: 1 } }))
    }
    await unwrap(
      admin.PUT('/v1/groups/{group}', {
        params: { path: { group: 'billing-g' } },
        body: { topic: 'billing', deadLetterTopic: 'billing-dlq' },
      }),
    )
    const { key } = await unwrap(
      admin.POST('/v1/keys', {
        body: {
          name: 'scoped',
          scopes: [
            { action: 'produce', topics: ['orders*'] },
            { action: 'consume', groups: ['billing-g'] },
          ],
        },
      }),
    )

    const page = await context.newPage()
    t.teardown(() => page.close())
    const errors = watchErrors(page)
    await page.goto(`${secured.url}/console/`)
    await page.locator('#key-form').waitFor({ state: 'visible' })
    await page.fill('#key-input', key)
    await page.click('#key-form button[type="submit"]')
    await waitForText(page, 'tr[data-topic="orders"] td.end-offsets', 'p0 0')
    t.equal(await page.locator('tr[data-topic="billing"]').count(), 0, 'topics the key may not read are not listed')

    await page.goto(`${secured.url}/console/#/groups`)
    await page.locator('tr[data-group="billing-g"]').waitFor()
    t.pass('its group is listed')
    await page.goto(`${secured.url}/console/#/dead-letters`)
    await waitForText(page, 'tr[data-group="billing-g"] td.dead-count', '–')
    t.pass('a dead-letter topic it may not read: the count is unknown, the page still shows')

    await page.goto(`${secured.url}/console/#/topics/billing`)
    await page.locator('main .error').first().waitFor()
    t.match(await page.locator('main .error').first().textContent(), /403, forbidden.*scopes do not cover this/s, 'a 403 is a message')
    t.same(
      errors.filter((e) => !/status of 40[13]/.test(e)),
      [],
      'no console errors but the refused loads',
    )

    // Swagger UI under its Content-Security-Policy: it renders, and nothing is blocked.
    const docs = await context.newPage()
    t.teardown(() => docs.close())
    const docsErrors = watchErrors(docs)
    const answer = await docs.goto(`${secured.url}/docs/`)
    t.match(answer?.headers()['content-security-policy'], /default-src 'none'/)
    await waitForText(docs, '.swagger-ui .info .title', 'hookq 1.0.0 OAS 3.1')
    t.same(docsErrors, [], 'no CSP violation or error in the docs page')
  })

  if (process.env.HOOKQ_CONSOLE_SCREENSHOT) {
    t.test('screenshot of a busy group', async (t) => screenshot(t, context, process.env.HOOKQ_CONSOLE_SCREENSHOT!))
  }
}

/** A group with traffic and a slow consumer, photographed after its chart has ~40 s of history. */
async function screenshot(t: Test, context: BrowserContext, file: string): Promise<void> {
  const { url } = await startListeningBroker(t)
  const hookq = createClient({ baseUrl: url })
  // About 30 msg/s: four partitions, one message in flight on each, 120 ms an answer.
  const receiver = await startReceiver(t, { status: 200, delayMs: 120 })
  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'orders' } }, body: { partitions: 4 } }))
  await unwrap(
    hookq.PUT('/v1/groups/{group}', {
      params: { path: { group: 'billing' } },
      body: { topic: 'orders', ackMode: 'auto', maxInFlight: 1 },
    }),
  )
  await unwrap(hookq.POST('/v1/groups/{group}/consumers', { params: { path: { group: 'billing' } }, body: { url: `${receiver.url}/a` } }))
  await unwrap(hookq.POST('/v1/groups/{group}/consumers', { params: { path: { group: 'billing' } }, body: { url: `${receiver.url}/b` } }))
  const page = await context.newPage()
  t.teardown(() => page.close())
  await page.goto(`${url}/console/#/groups/billing`)
  // 20 s of bursts (about 50 msg/s) that outrun the consumer, then 20 s in which it catches up.
  for (let round = 0; round < 20; round++) {
    const n = round < 10 ? 60 + round * 10 : 0
    if (n > 0) {
      await unwrap(
        hookq.POST('/v1/topics/{topic}/messages', {
          params: { path: { topic: 'orders' } },
          body: { messages: Array.from({ length: n }, (_, i) => ({ key: `user-${i % 17}`, value: { order: round * 1000 + i } })) },
        }),
      )
    }
    await new Promise((r) => setTimeout(r, 2_000)) // paces the traffic the chart shows, not a wait for a result
  }
  await page.screenshot({ path: file, fullPage: true })
  t.pass(`wrote ${file}`)
}
