/** The message value used by the produce load and the baseline: a JSON object of about 200 bytes. */
export const MESSAGE_VALUE = {
  event: 'order.created',
  orderId: 'ord-7f3a9c2e-51b4-4d8e-9a61-2c0b7e4f8d13',
  customer: { id: 'cus-000123456', tier: 'gold' },
  items: [
    { sku: 'SKU-4411', qty: 2, price: 19.99 },
    { sku: 'SKU-9020', qty: 1, price: 5.5 },
  ],
  note: 'deliver to the side door',
}
export const MESSAGE_VALUE_JSON = JSON.stringify(MESSAGE_VALUE)
