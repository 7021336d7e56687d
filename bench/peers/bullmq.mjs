// BullMQ on one side of bench/bench_peers.py: the same workloads as delayq's user-level
// producer and consumer, driven by the Python script (which owns the Redis server, the clock
// plan and the statistics).
//
//   node bullmq.mjs worker  '<spec json>'   a Worker (concurrency 50, no-op processor): prints
//                                           {"ready": true}, then, once `expected` jobs started
//                                           (or `timeout_s` passed), their lateness as JSON
//   node bullmq.mjs produce '<spec json>'   adds the workload's jobs, prints {"enqueue_s": …}
//
// Lateness is processing start minus due time, both on this host's wall clock (the same clock
// the Python side and Redis use), in fractional ms: due = the job's timestamp + opts.delay (its
// `delay` field is zeroed when the job is promoted), and the producer sets the timestamp itself
// so the due time is exactly the one planned.
import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';

const QUEUE_NAME = 'peers';
const WORKER_CONCURRENCY = 50;
// What most BullMQ deployments set, and what delayq does on ack: finished jobs leave Redis.
const JOB_OPTIONS = { removeOnComplete: true, removeOnFail: true };

const nowMs = () => performance.timeOrigin + performance.now();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Each BullMQ object gets its own connection; maxRetriesPerRequest null as BullMQ requires.
const connect = (url) => new IORedis(url, { maxRetriesPerRequest: null });

function print(value) {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

async function worker(spec) {
  const latenessMs = [];
  let firstMs = 0;
  let lastMs = 0;
  const connection = connect(spec.url);
  const bullWorker = new Worker(
    QUEUE_NAME,
    async (job) => {
      const now = nowMs();
      if (latenessMs.length === 0) firstMs = now;
      lastMs = now;
      latenessMs.push(now - (job.timestamp + job.opts.delay));
    },
    { connection, concurrency: WORKER_CONCURRENCY },
  );
  await bullWorker.waitUntilReady();
  print({ ready: true });
  const deadline = Date.now() + spec.timeout_s * 1000;
  while (latenessMs.length < spec.expected && Date.now() < deadline) await sleep(20);
  await bullWorker.close();
  await connection.quit();
  print({ lateness_ms: latenessMs, first_ms: firstMs, last_ms: lastMs });
}

// Due times are sorted (as a producer flushing a time-ordered stream would send them) and
// spread uniformly over the window; a zero window is a herd due at one instant.
function dueTimesMs(spec) {
  const dues = Array.from({ length: spec.count }, () => Math.round(spec.start_ms + Math.random() * spec.window_ms));
  return dues.sort((a, b) => a - b);
}

async function produceBatches(queue, spec, data) {
  const dues = dueTimesMs(spec);
  let next = 0;
  const sender = async () => {
    while (next < dues.length) {
      const chunk = dues.slice(next, next + spec.batch);
      next += chunk.length;
      const timestamp = Date.now();
      await queue.addBulk(
        chunk.map((due) => ({
          name: 'm',
          data,
          opts: { ...JOB_OPTIONS, timestamp, delay: Math.max(0, due - timestamp) },
        })),
      );
    }
  };
  await Promise.all(Array.from({ length: spec.in_flight }, sender));
}

// `rate_per_s` single adds a second, one awaited after the other, each due 0.5-1.5 s later:
// every 1 ms tick sends the adds the rate owes so far.
async function produceSteady(queue, spec, data) {
  const start = nowMs();
  const delaySpanMs = spec.delay_max_ms - spec.delay_min_ms + 1;
  let sent = 0;
  while (sent < spec.count) {
    const owed = Math.min(spec.count, Math.floor(((nowMs() - start) / 1000) * spec.rate_per_s));
    for (; sent < owed; sent++) {
      const delay = spec.delay_min_ms + Math.floor(Math.random() * delaySpanMs);
      await queue.add('m', data, { ...JOB_OPTIONS, timestamp: Date.now(), delay });
    }
    await sleep(1);
  }
}

async function produce(spec) {
  const connection = connect(spec.url);
  const queue = new Queue(QUEUE_NAME, { connection });
  await queue.waitUntilReady();
  // JSON-encoded as BullMQ stores it, the data takes `payload_bytes` bytes (the quotes count).
  const data = 'x'.repeat(spec.payload_bytes - 2);
  const start = nowMs();
  if (spec.kind === 'steady') await produceSteady(queue, spec, data);
  else await produceBatches(queue, spec, data);
  const enqueueS = (nowMs() - start) / 1000;
  await queue.close();
  await connection.quit();
  print({ enqueue_s: enqueueS, end_ms: start + enqueueS * 1000 });
}

const [role, specJson] = process.argv.slice(2);
const roles = { worker, produce };
if (!(role in roles) || specJson === undefined) {
  process.stderr.write('usage: node bullmq.mjs worker|produce <spec json>\n');
  process.exit(2);
}
await roles[role](JSON.parse(specJson));
