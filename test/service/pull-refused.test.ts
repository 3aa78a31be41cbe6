/**
 * A long poll gathered over other broker processes answers the refusal of an owner that refused the
 * caller's key (deleted or expired there first), not an empty 200 a moment before this process
 * would refuse the key too (CI24: test/http/key-freshness answered 200 when the other process owned
 * the partition). The gather alone (src/service/acks.ts): the owners are stand-ins for forwarded
 * calls (src/http/forward.ts throws their 401 as this error); the real path runs in test/http/key-freshness.
 */
import t from '../helpers/tap.ts'
import { HookqError } from '../../src/core/errors.ts'
import { AckService, type PullElsewhere, type PullSource } from '../../src/service/acks.ts'
import type { GroupService } from '../../src/service/groups.ts'

const refusal = () => new HookqError('unauthorized', 'the API key was deleted')
/** This process: the group is a pull group here, and nothing is leasable on the partitions it owns. */
const local = {
  deliveryOf: () => 'pull' as const,
  hasGroup: () => true,
  pull: async () => [],
  probe: async (_g: string, waitMs: number, signal?: AbortSignal) =>
    new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), waitMs)
      signal?.addEventListener('abort', () => {
        clearTimeout(timer)
        resolve(false)
      })
    }),
  giveBack: () => {},
  ack: async () => [],
  nack: async () => [],
  extend: async () => [],
}
const acks = new AckService({} as GroupService, local)
const elsewhere = (owner: PullSource): PullElsewhere => ({ owners: () => ({ selfParts: 1, others: [owner] }), watch: () => () => {} })

t.test("an owner's probe refuses the key: the long poll answers that refusal, not an empty 200", async (t) => {
  const owner: PullSource = {
    parts: 1,
    pull: async () => ({ envelopes: [], giveBack: () => {} }),
    probe: async () => Promise.reject(refusal()),
  }
  await t.rejects(acks.pull('g', { maxMessages: 10, waitMs: 20_000, leaseMs: undefined }, new AbortController().signal, elsewhere(owner)), {
    code: 'unauthorized',
  })
})

t.test("an owner's lease refuses the key: what another owner leased goes back, and the caller gets the refusal", async (t) => {
  const givenBack: string[] = []
  const envelope = JSON.stringify({ deliveryId: 'd-1' })
  const leasing: PullSource = {
    parts: 1,
    pull: async () => ({ envelopes: [envelope], giveBack: (ids) => givenBack.push(...ids) }),
    probe: async () => true,
  }
  const refusing: PullSource = { parts: 1, pull: async () => Promise.reject(refusal()), probe: async () => true }
  const both: PullElsewhere = { owners: () => ({ selfParts: 0, others: [leasing, refusing] }), watch: () => () => {} }
  await t.rejects(acks.pull('g', { maxMessages: 10, waitMs: 0, leaseMs: undefined }, new AbortController().signal, both), {
    code: 'unauthorized',
  })
  t.same(givenBack.length, 1, 'the lease made for the refused caller is given back')
})

t.test('any other failure of an owner is not a refusal: the poll waits on and answers empty at its end', async (t) => {
  const broken: PullSource = {
    parts: 1,
    pull: async () => Promise.reject(new Error('socket hang up')),
    probe: async () => Promise.reject(new Error('socket hang up')),
  }
  t.same(await acks.pull('g', { maxMessages: 10, waitMs: 200, leaseMs: undefined }, new AbortController().signal, elsewhere(broken)), [])
})
