// The BullMQ side of the ojs-jetstream benchmark (docs/performance.md §1): the shapes of the
// gateway's enqueue-1, drain, e2e and latency scenarios, run with BullMQ against Redis, so
// the gateway's figures can be quoted against a Redis-backed queue measured on the same
// machine in the same run. `examples/bench/` runs it with `--bullmq URL`; by hand:
//
//   node examples/bench/bullmq/bench.mjs --redis redis://127.0.0.1:16379 [--jobs 20000]
//       [--producers 64] [--workers 64] [--rate 200] [--latency-secs 10]
//       [--latency-workers 8] [--scenarios enqueue,drain,e2e,latency]
//
// Prints one JSON line per scenario on stdout (`scenario`, `jobs`, `secs`, `jobs_per_sec`,
// `p50_ms`, `p99_ms`, `max_ms`, `errors`, `missing`, `cpu_secs` of redis-server and of this
// process); progress and the first few errors go to stderr. Producers are concurrent loops
// of `Queue.add` on one Queue; workers are one Worker whose concurrency is the number of
// workers. Jobs are removed when they complete (`removeOnComplete: true`).
//
// BullMQ 6 leaves the choice of Redis client to its user: `ioredis` is its default driver
// (an optional peer dependency), pinned here at the major BullMQ's own tests use.

import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';

// Longest a scenario waits for jobs that do not complete before it counts them as missing
// (the Rust bench's DRAIN_PATIENCE).
const PATIENCE_MS = 20_000;

const { values: flags } = parseArgs({
    options: {
        redis: { type: 'string', default: 'redis://127.0.0.1:6379' },
        jobs: { type: 'string', default: '20000' },
        producers: { type: 'string', default: '64' },
        workers: { type: 'string', default: '64' },
        rate: { type: 'string', default: '200' },
        'latency-secs': { type: 'string', default: '10' },
        'latency-workers': { type: 'string', default: '8' },
        scenarios: { type: 'string', default: 'enqueue,drain,e2e,latency' },
    },
});
const number = (name) => {
    const value = Number(flags[name]);
    if (!Number.isInteger(value) || value <= 0) {
        console.error(`bench.mjs: --${name}: cannot read ${JSON.stringify(flags[name])}`);
        process.exit(2);
    }
    return value;
};
const settings = {
    jobs: number('jobs'),
    producers: number('producers'),
    workers: number('workers'),
    rate: number('rate'),
    latencySecs: number('latency-secs'),
    latencyWorkers: number('latency-workers'),
};
const wanted = new Set(flags.scenarios.split(','));

// Workers need `maxRetriesPerRequest: null` (their blocking commands must not time out).
const connection = { url: flags.redis, maxRetriesPerRequest: null };
const jobOptions = { removeOnComplete: true };
const prefix = `bench-${process.pid}`;
// The connection that reads redis-server's own CPU time (INFO cpu).
const admin = new IORedis(flags.redis, { maxRetriesPerRequest: 1 });
try {
    await admin.ping();
} catch (e) {
    console.error(`bench.mjs: no Redis answers at ${flags.redis}: ${e.message}`);
    process.exit(1);
}

/** Errors of a scenario: counted, the first three printed. */
class Tally {
    errors = 0;

    record(error) {
        if (this.errors++ < 3) {
            console.error(`bench.mjs: ${error instanceof Error ? error.message : error}`);
        }
    }
}

const sleepUntil = (at) =>
    new Promise((resolve) => setTimeout(resolve, Math.max(0, at - performance.now())));

/** User plus system CPU seconds of redis-server so far, as it reports them. */
async function redisCpu() {
    const info = await admin.info('cpu');
    const field = (name) => Number(info.match(new RegExp(`^${name}:([0-9.]+)`, 'm'))?.[1] ?? NaN);
    return field('used_cpu_user') + field('used_cpu_sys');
}

/** CPU seconds of redis-server and of this process from now until `finish()`. */
async function cpuMeter() {
    const [redis, node] = [await redisCpu(), process.cpuUsage()];
    return async () => {
        const spent = process.cpuUsage(node);
        return { redis: (await redisCpu()) - redis, node: (spent.user + spent.system) / 1e6 };
    };
}

function openQueue(name, tally) {
    const queue = new Queue(`${prefix}-${name}`, { connection, defaultJobOptions: jobOptions });
    queue.on('error', (e) => tally.record(e));
    return queue;
}

/**
 * Adds jobs `0..jobs` from `producers` concurrent loops, one `Queue.add` each; with `pace`
 * (ms), job i is due `i × pace` after the start. Each carries `[index, add time]` (ms on
 * this process's clock). Resolves to the number added.
 */
async function produce(queue, { jobs, producers, pace }, tally) {
    let next = 0;
    let added = 0;
    const started = performance.now();
    const producer = async () => {
        for (let i = next++; i < jobs; i = next++) {
            if (pace) {
                await sleepUntil(started + i * pace);
            }
            try {
                await queue.add('bench.job', { args: [i, performance.now()] });
                added++;
            } catch (e) {
                tally.record(e);
            }
        }
    };
    await Promise.all(Array.from({ length: producers }, producer));
    return added;
}

/**
 * A Worker of `concurrency` on `queue`, started and stopped by the scenario. It counts each
 * job once (a second completion is an error) and notes, when each job starts, how long ago
 * it was added.
 */
class Workers {
    constructor(queue, concurrency, jobs, tally) {
        this.tally = tally;
        this.seen = new Uint8Array(jobs);
        this.done = 0;
        this.last = 0;
        this.latencies = [];
        this.worker = new Worker(
            queue.name,
            async (job) => {
                this.latencies.push(performance.now() - job.data.args[1]);
            },
            { connection, concurrency, autorun: false },
        );
        this.worker.on('completed', (job) => {
            const i = job.data.args[0];
            if (this.seen[i]) {
                tally.record(`job ${i} completed twice`);
                return;
            }
            this.seen[i] = 1;
            this.done++;
            this.last = performance.now();
        });
        this.worker.on('failed', (job, e) => tally.record(`job ${job?.id} failed: ${e.message}`));
        this.worker.on('error', (e) => tally.record(e));
    }

    async start() {
        await this.worker.waitUntilReady();
        this.worker.run().catch((e) => this.tally.record(e));
    }

    /** Resolves once `target()` jobs completed, or none did for `PATIENCE_MS`. */
    async completed(target) {
        let progress = [this.done, performance.now()];
        let timer;
        await new Promise((resolve) => {
            const check = () => {
                if (this.done >= target()) {
                    resolve();
                } else if (this.done > progress[0]) {
                    progress = [this.done, performance.now()];
                } else if (performance.now() - progress[1] > PATIENCE_MS) {
                    resolve();
                }
            };
            // After the listener that counts; the timer notices a target that moved and
            // the patience running out.
            this.worker.on('completed', check);
            timer = setInterval(check, 100);
            check();
        });
        clearInterval(timer);
        await this.worker.close();
    }
}

function percentile(sorted, p) {
    return sorted.length ? sorted[Math.round((sorted.length - 1) * p)] : null;
}

function report(scenario, { jobs, secs, latencies, errors, missing, cpu }) {
    const sorted = latencies ? Float64Array.from(latencies).sort() : [];
    const line = {
        scenario,
        jobs,
        secs,
        jobs_per_sec: secs > 0 ? jobs / secs : 0,
        p50_ms: percentile(sorted, 0.5),
        p99_ms: percentile(sorted, 0.99),
        max_ms: percentile(sorted, 1),
        errors,
        missing,
        cpu_secs: cpu,
    };
    console.log(JSON.stringify(line));
    console.error(
        `bench.mjs: ${scenario} — ${jobs} jobs in ${secs.toFixed(2)} s, ${errors} errors, ${missing} missing`,
    );
}

/** enqueue-1 (reported when asked for), then drain: the jobs it added, completed. */
async function enqueueAndDrain() {
    const tally = new Tally();
    const queue = openQueue('drain', tally);
    await queue.waitUntilReady();
    const load = { jobs: settings.jobs, producers: settings.producers };
    let finish = await cpuMeter();
    let start = performance.now();
    const added = await produce(queue, load, tally);
    const secs = (performance.now() - start) / 1000;
    if (wanted.has('enqueue')) {
        const cpu = await finish();
        report('enqueue-1', { jobs: added, secs, errors: tally.errors, missing: load.jobs - added, cpu });
    }
    if (wanted.has('drain')) {
        const before = tally.errors;
        const workers = new Workers(queue, settings.workers, load.jobs, tally);
        await workers.start();
        finish = await cpuMeter();
        start = performance.now();
        await workers.completed(() => added);
        report('drain', {
            jobs: workers.done,
            secs: ((workers.last || performance.now()) - start) / 1000,
            errors: tally.errors - before,
            missing: Math.max(0, added - workers.done),
            cpu: await finish(),
        });
    }
    await queue.obliterate({ force: true });
    await queue.close();
}

/** Producers and a Worker at once, from the first add to the last completion. */
async function runThrough(scenario, load, concurrency) {
    const tally = new Tally();
    const queue = openQueue(scenario, tally);
    await queue.waitUntilReady();
    const workers = new Workers(queue, concurrency, load.jobs, tally);
    await workers.start();
    const finish = await cpuMeter();
    const start = performance.now();
    // Every job, until the producers are done; then the jobs they added.
    let target = load.jobs;
    const producing = produce(queue, load, tally).then((added) => {
        target = added;
    });
    await workers.completed(() => target);
    await producing;
    report(scenario, {
        jobs: workers.done,
        secs: ((workers.last || performance.now()) - start) / 1000,
        latencies: load.pace ? workers.latencies : null,
        errors: tally.errors,
        missing: Math.max(0, load.jobs - workers.done),
        cpu: await finish(),
    });
    await queue.obliterate({ force: true });
    await queue.close();
}

if (wanted.has('enqueue') || wanted.has('drain')) {
    await enqueueAndDrain();
}
if (wanted.has('e2e')) {
    await runThrough('e2e', { jobs: settings.jobs, producers: settings.producers }, settings.workers);
}
if (wanted.has('latency')) {
    const load = {
        jobs: settings.rate * settings.latencySecs,
        producers: 4,
        pace: 1000 / settings.rate,
    };
    await runThrough('latency', load, settings.latencyWorkers);
}
await admin.quit();
