/** Pushes as the broker sends them, for tests of the consumer helper without a broker. */
import { signHeaders, signWebhook } from '@hookq/client/consumer'

/**
 * A push of `body` signed with `secret` now, with webhook-id `id`: the Standard Webhooks headers
 * and hookq-signature over no hookq-* headers (the consumer helper requires it even then).
 */
export function signedPush(body: string, secret: string, id: string): { headers: Record<string, string>; body: string } {
  const timestampSeconds = Math.floor(Date.now() / 1000)
  return {
    headers: {
      'webhook-id': id,
      'webhook-timestamp': String(timestampSeconds),
      'webhook-signature': signWebhook({ webhookId: id, timestampSeconds, body, secrets: secret }),
      'hookq-signature': signHeaders({ webhookId: id, timestampSeconds, headers: {}, secrets: secret }),
    },
    body,
  }
}
