/**
 * The push JWT signer's token cache (src/dispatch/jwt-keys.ts): a push gets its consumer's cached
 * `authorization` line as it is (a string, no signature) while the token has more than a minute to
 * live, the key that signed it still signs, and the keys and issuer are those it was signed with;
 * otherwise a new token with a new jti. Every token is checked by jose against the database's
 * public keys, on a real database, with the signer's clock moved by hand.
 */
import t from '../helpers/tap.ts'
import { createLocalJWKSet, decodeProtectedHeader, jwtVerify, type JWK } from 'jose'
import { JWT_TTL_S, JwtSigner, rotateSigningKey } from '../../src/dispatch/jwt-keys.ts'
import { SecretBox } from '../../src/security/secrets.ts'
import { openDatabase } from '../../src/store/db.ts'
import { listLiveJwtKeys } from '../../src/store/jwt-keys.ts'
import { testDatabase } from '../helpers/db.ts'

const database = await testDatabase(t)
const db = openDatabase(database.url, 2)
t.teardown(() => db.close())
const box = new SecretBox()
let now = Date.now()
const signer = new JwtSigner({ db: db.pool, box, issuer: 'https://hookq.test', refreshMs: 3_600_000, now: () => now })
await signer.start()
t.teardown(() => signer.stop())

const AUD = 'https://consumer.test/hook'
const PREFIX = 'authorization: Bearer '

/** A line's token verified with the database's listed keys at the signer's time: its claims and kid. */
async function verify(line: string, issuer = 'https://hookq.test') {
  t.match(line, /^authorization: Bearer [\w-]+\.[\w-]+\.[\w-]+\r\n$/, 'one header line, nothing else')
  const token = line.slice(PREFIX.length, -2)
  const keys = (await listLiveJwtKeys(db.pool, new Date(now))).map((k) => JSON.parse(k.publicJwk) as JWK)
  const { payload } = await jwtVerify(token, createLocalJWKSet({ keys }), { issuer, audience: AUD, currentDate: new Date(now) })
  return { ...payload, kid: decodeProtectedHeader(token).kid }
}

t.test('a cached token is reused as it is, and replaced when it nears its end, its key is replaced, or the issuer changes', async (t) => {
  const first = await signer.authLine('c1', 'billing', AUD)
  const claims = await verify(first)
  t.equal(claims.sub, 'billing')
  t.equal(claims.exp! - claims.iat!, JWT_TTL_S, 'exp is iat + 5 minutes (the contract allows at most an hour)')
  t.type(claims.jti, 'string')

  const again = signer.authLine('c1', 'billing', AUD)
  t.equal(typeof again, 'string', 'the next push gets the cached line at once, nothing signed')
  t.equal(again, first, 'the same token')
  const other = await verify(await signer.authLine('c2', 'billing', AUD))
  t.not(other.jti, claims.jti, "another consumer's token has a jti of its own")
  t.equal(typeof signer.authLine('c1', 'orders', AUD), 'object', 'another sub (the group) is signed anew')
  t.equal((await verify(await signer.authLine('c1', 'billing', AUD))).sub, 'billing')
  const current = signer.authLine('c1', 'billing', AUD) as string

  now += 239_000
  t.equal(signer.authLine('c1', 'billing', AUD), current, 'still used 239 s after it was signed')
  now += 2_000
  const renewed = signer.authLine('c1', 'billing', AUD)
  t.equal(typeof renewed, 'object', 'a new token less than a minute before the old one expires')
  const renewedClaims = await verify(await renewed)
  t.not(renewedClaims.jti, claims.jti, 'with a new jti')

  // A rotation elsewhere (the CLI, another process): listed now, signing 30 s from now.
  const rotated = await rotateSigningKey(db, box, { propagationMs: 30_000, nowMs: now })
  await signer.refresh()
  const beforeSwitch = await verify(await signer.authLine('c1', 'billing', AUD))
  t.equal(beforeSwitch.kid, claims.kid, 'the old key signs until the new one is due')
  t.not(beforeSwitch.jti, renewedClaims.jti, 'the refresh that found a new key made cached tokens stale')
  t.equal(typeof signer.authLine('c1', 'billing', AUD), 'string', 'and that token is cached in turn')
  await signer.refresh()
  t.equal(typeof signer.authLine('c1', 'billing', AUD), 'string', 'a refresh that finds nothing new keeps the token')

  now = rotated.signFrom.getTime() + 1
  const afterSwitch = signer.authLine('c1', 'billing', AUD)
  t.equal(typeof afterSwitch, 'object', 'once the new key is due, the cached token is not used, with no refresh in between')
  t.equal((await verify(await afterSwitch)).kid, rotated.kid, 'the new key signs')

  signer.setKeys(await listLiveJwtKeys(db.pool, new Date(now)), 'https://other.test')
  t.equal(
    (await verify(await signer.authLine('c1', 'billing', AUD), 'https://other.test')).iss,
    'https://other.test',
    'a new issuer: signed anew',
  )

  signer.forget('c1')
  t.equal(typeof signer.authLine('c1', 'billing', AUD), 'object', 'a forgotten token (a 401) is signed anew')
})
