// Preloaded (node --import) into every process a test starts: brokers, CLI runs, consumers.
// A test file that runs out of time is killed by tap before its teardowns run, and the processes
// it started lived on as orphans, loading the machine until the next files timed out too (a CI run
// ended with a dozen orphaned brokers). A child whose parent is gone now ends itself.
const parent = process.ppid
setInterval(() => {
  if (process.ppid !== parent) process.kill(process.pid, 'SIGKILL')
}, 500).unref()
