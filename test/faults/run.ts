// `npm run test:faults`: the long fault-injection profile (about 5 minutes), then a one-line summary.
// HOOKQ_FAULTS_PROFILE=short runs the short one instead.
process.env.HOOKQ_FAULTS_PROFILE ??= 'long'
process.env.DATABASE_URL ??= 'postgresql://postgres@127.0.0.1:5432/postgres'
await import('./faults.test.ts')
