/**
 * A URL with what may be a credential hidden: the user and password (`https://user:pw@host`), the
 * value of each query parameter (`?token=...`) and the fragment, each shown as `***`. The scheme,
 * host, port, path and the query's names stay, enough to tell consumers apart. Paths are kept:
 * a secret in a path (Slack-style webhook URLs) is not told apart from a plain one.
 */
export function redactUrl(text: string): string {
  if (!URL.canParse(text)) return '***'
  const url = new URL(text)
  if (url.username !== '' || url.password !== '') {
    url.username = '***'
    url.password = ''
  }
  if (url.search !== '') {
    const names = [...new URLSearchParams(url.search).keys()]
    url.search = names.map((n) => `${encodeURIComponent(n)}=***`).join('&')
  }
  if (url.hash !== '') url.hash = '***'
  return url.toString()
}
