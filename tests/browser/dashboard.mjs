// Drives the ojs-jetstream dashboard (/ojs/admin/) in Chromium against a running gateway
// with no jobs in the queues it uses: OJS_URL, and OJS_API_KEY when the gateway asks for
// keys. scripts/browser-test.sh starts a fresh gateway and runs this. Exits non-zero, naming
// the failed check, on any failure; screenshots go to docs/screenshots/.
import { mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const base = (process.env.OJS_URL || '').replace(/\/+$/, '');
const key = process.env.OJS_API_KEY || '';
const chromiumBin = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
const screenshots = fileURLToPath(new URL('../../docs/screenshots/', import.meta.url));
const dashboard = `${base}/ojs/admin/`;
// From navigation to the first rows of a 10,000-job queue.
const FIRST_ROWS_BUDGET_MS = 300;

const BULK = 'reports'; // 10,000 available jobs
const MAIL = 'email'; // dead-lettered jobs
const IMAGES = 'images'; // a mix of states; paused, resumed and purged from its page
const THUMBS = 'thumbnails'; // one job, followed on its page
const BULK_JOBS = 10_000;
const DEAD = 4;

// ---------------------------------------------------------------------------------------
// The HTTP API

async function call(method, p, body) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (key) headers.Authorization = `Bearer ${key}`;
  const res = await fetch(base + p, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${p} answered ${res.status}: ${text.slice(0, 600)}`);
  return text ? JSON.parse(text) : null;
}

const get = (p) => call('GET', p);
const post = (p, body) => call('POST', p, body);

async function queue(name) {
  return get(`/ojs/v1/admin/queues/${name}`);
}

// Polls `probe` until it returns a truthy value, for up to `ms`.
async function eventually(what, probe, ms = 5000) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    last = await probe();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`${what}: not so after ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

const count = (text) => Number(String(text).replace(/[^\d.]/g, ''));

// ---------------------------------------------------------------------------------------
// Seeding

async function seed() {
  const queues = await get('/ojs/v1/admin/queues?per_page=100');
  for (const q of queues.items) {
    const jobs = Object.values(q.counts || {}).reduce((a, b) => a + b, 0);
    expect(![BULK, MAIL, IMAGES, THUMBS].includes(q.name) || jobs === 0,
      `queue ${q.name} already has ${jobs} jobs: run against a fresh gateway (scripts/browser-test.sh starts one)`);
  }

  const jobs = Array.from({ length: BULK_JOBS }, (_, i) => ({
    type: 'report.build', args: [{ report: `monthly-${i}` }], options: { queue: BULK },
  }));
  const started = performance.now();
  const batch = await post('/ojs/v1/jobs/batch', { jobs });
  expect(batch.count === BULK_JOBS || (batch.jobs || []).length === BULK_JOBS, `the batch enqueued ${batch.count} jobs, not ${BULK_JOBS}`);
  console.log(`   seeded ${BULK_JOBS} jobs into ${BULK} in ${Math.round(performance.now() - started)} ms`);

  // Dead-lettered jobs: one attempt each, failed. The second argument is markup that the
  // page must show as text.
  const dead = [];
  for (let i = 0; i < DEAD; i++) {
    const res = await post('/ojs/v1/jobs', {
      type: 'email.send',
      args: [`user${i}@example.com`, '<img src=x onerror="window.__injected=1">'],
      meta: { tenant: 'acme' },
      options: { queue: MAIL, retry: { max_attempts: 1, on_exhaustion: 'dead_letter' } },
    });
    dead.push(res.job.id);
  }
  const fetched = await post('/ojs/v1/workers/fetch', { queues: [MAIL], worker_id: 'mailer-1', count: DEAD });
  expect(fetched.jobs.length === DEAD, `fetched ${fetched.jobs.length} of the ${DEAD} email jobs`);
  for (const job of fetched.jobs) {
    await post('/ojs/v1/workers/fail', {
      job_id: job.id, worker_id: 'mailer-1',
      error: { code: 'smtp_unavailable', message: 'SMTP connection refused by mail.example.com:25', retryable: true },
    });
  }
  for (const id of dead) {
    await eventually(`job ${id} discarded`, async () => (await get(`/ojs/v1/admin/jobs/${id}`)).state === 'discarded');
  }

  for (let i = 0; i < 6; i++) {
    await post('/ojs/v1/jobs', { type: 'image.resize', args: [`photo-${i}.png`, 640], options: { queue: IMAGES } });
  }
  const images = await post('/ojs/v1/workers/fetch', { queues: [IMAGES], worker_id: 'resizer-1', count: 3 });
  await post('/ojs/v1/workers/ack', { job_id: images.jobs[0].id, worker_id: 'resizer-1', result: { width: 640, bytes: 48213 } });
  await post('/ojs/v1/workers/ack', { job_id: images.jobs[1].id, worker_id: 'resizer-1', result: { width: 640, bytes: 51877 } });
  await post('/ojs/v1/workers/fail', { job_id: images.jobs[2].id, worker_id: 'resizer-1', error: { code: 'decode_error', message: 'not a PNG file', retryable: true } });

  await post('/ojs/v1/cron', {
    name: 'nightly-report', expression: '0 3 * * *', timezone: 'UTC',
    job_template: { type: 'report.build', args: [{ report: 'nightly' }], options: { queue: BULK } },
  });
  const workflow = await post('/ojs/v1/workflows', {
    type: 'chain', name: 'order-pipeline',
    steps: [
      { type: 'order.validate', args: [{ order_id: 'o-1' }], options: { queue: 'orders' } },
      { type: 'payment.charge', args: [], options: { queue: 'orders' } },
    ],
  });
  return { dead, workflow: (workflow.workflow || workflow).id };
}

// ---------------------------------------------------------------------------------------
// The browser

let browser;
let page;
const pageErrors = [];

async function open(hash) {
  await page.goto(`${dashboard}#${hash}`);
}

// No error notice on the page and no script error so far.
async function clean() {
  expect(!pageErrors.length, `the page reported errors: ${pageErrors.join(' | ')}`);
  const notices = await page.locator('[data-testid=error]').allTextContents();
  expect(!notices.length, `the page shows errors: ${notices.join(' | ')}`);
}

async function shot(name) {
  await page.screenshot({ path: path.join(screenshots, `${name}.png`) });
}

// ---------------------------------------------------------------------------------------
// The checks, in order: each builds on the ones before.

let seeded;
const checks = [
  ['seed 10,000 jobs, dead-lettered jobs, a cron entry and a workflow', async () => {
    seeded = await seed();
  }],

  ['the dashboard asks for the API key, and works with it', async () => {
    await page.goto(dashboard);
    if (!key) {
      await page.locator('[data-testid=queue-row]').first().waitFor();
      return;
    }
    const banner = page.locator('[data-testid=auth-banner]');
    await banner.waitFor();
    expect(/API key/.test(await banner.textContent()), 'the 401 banner does not mention the API key');
    await page.locator('[data-testid=api-key-input]').fill(key);
    await page.locator('[data-testid=api-key-save]').click();
    await page.locator('[data-testid=queue-row]').first().waitFor();
    expect(await banner.isHidden(), 'the banner stays after the key was saved');
    pageErrors.length = 0; // the 401s before the key were expected
  }],

  ['the overview shows each queue’s counts', async () => {
    await open('/');
    // The counts the API settles on for the seeded queues; the open page must follow them.
    const want = await eventually('the admin API counting the seeded jobs', async () => {
      const items = (await get('/ojs/v1/admin/queues?per_page=100')).items;
      const bulk = items.find((q) => q.name === BULK);
      const mail = items.find((q) => q.name === MAIL);
      return bulk && bulk.counts.available === BULK_JOBS && mail && mail.counts.discarded === DEAD && [bulk, mail];
    });
    for (const q of want) {
      const row = page.locator(`[data-testid=queue-row][data-queue="${q.name}"]`);
      for (const [state, n] of Object.entries(q.counts)) {
        const cell = row.locator(`[data-testid=count-${state}]`);
        const text = n.toLocaleString('en-US');
        await cell.filter({ hasText: new RegExp(`^${text}$`) }).waitFor({ timeout: 5000 }).catch(async () => {
          throw new Error(`overview: ${q.name} ${state} shows ${await cell.textContent()}, the API says ${text}`);
        });
      }
    }
    const total = count(await page.locator('[data-testid=stat-available] .value').textContent());
    expect(total >= BULK_JOBS, `overview: ${total} available jobs in all, expected at least ${BULK_JOBS}`);
    await clean();
    await shot('overview');
  }],

  [`the page of a ${BULK_JOBS}-job queue shows its first rows within ${FIRST_ROWS_BUDGET_MS} ms`, async () => {
    await page.goto('about:blank');
    const started = performance.now();
    await page.goto(`${dashboard}#/queues/${BULK}`, { waitUntil: 'commit' });
    await page.locator('[data-testid=job-row]').first().waitFor();
    const ms = performance.now() - started;
    console.log(`   first rows after ${ms.toFixed(0)} ms (budget ${FIRST_ROWS_BUDGET_MS} ms)`);
    expect(ms < FIRST_ROWS_BUDGET_MS, `the first rows took ${ms.toFixed(0)} ms, over the ${FIRST_ROWS_BUDGET_MS} ms budget`);

    const newest = (await get(`/ojs/v1/admin/jobs?queue=${BULK}&per_page=20`)).items;
    const ids = await page.locator('[data-testid=job-row]').evaluateAll((rows) => rows.map((r) => r.dataset.jobId));
    expect(ids.length === 20 && ids[0] === newest[0].id, `the table shows ${ids.length} rows starting ${ids[0]}, the API's newest is ${newest[0].id}`);
    await page.locator('[data-testid=queue-count-available]').filter({ hasText: '10,000' }).waitFor();
    await page.locator('[data-testid=jobs-range]').filter({ hasText: `of ${BULK_JOBS.toLocaleString('en-US')}` }).waitFor();
    await clean();
    await shot('queue');

    await page.locator('[data-testid=jobs-next]').click();
    await page.locator('[data-testid=jobs-range]').filter({ hasText: /^21–40 / }).waitFor();
    const second = await page.locator('[data-testid=job-row]').first().getAttribute('data-job-id');
    expect(!ids.includes(second), 'the next page repeats a row of the first');
  }],

  ['a job’s page shows its envelope, errors and arguments as text', async () => {
    const id = seeded.dead[0];
    await open(`/jobs/${id}`);
    await page.locator('[data-testid=job-error]').filter({ hasText: 'SMTP connection refused' }).first().waitFor();
    const args = await page.locator('[data-testid=job-args]').textContent();
    expect(args.includes('<img src=x'), 'the arguments are not shown as text');
    expect(await page.locator('[data-testid=job-args] img').count() === 0, 'an argument became markup');
    expect(await page.evaluate(() => window.__injected === undefined), 'an argument ran as script');
    expect((await page.locator('[data-testid=job-meta]').textContent()).includes('acme'), 'the meta is missing');
    expect(await page.locator('[data-testid=job-retry]').isEnabled(), 'Retry is disabled for a discarded job');
    await clean();
    await shot('job');
  }],

  ['a job’s page follows the job live', async () => {
    const { job } = await post('/ojs/v1/jobs', { type: 'thumbnail.make', args: ['live.png', 320], options: { queue: THUMBS } });
    await open(`/jobs/${job.id}`);
    const state = page.locator('[data-testid=page-job] h1 [data-testid=state]');
    await state.filter({ hasText: 'available' }).waitFor();
    const fetched = await post('/ojs/v1/workers/fetch', { queues: [THUMBS], worker_id: 'thumbnailer-1' });
    expect(fetched.jobs.length === 1 && fetched.jobs[0].id === job.id, `the fetch did not hand out job ${job.id}`);
    await state.filter({ hasText: 'active' }).waitFor();
    await post('/ojs/v1/workers/ack', { job_id: job.id, worker_id: 'thumbnailer-1', result: { width: 320 } });
    await page.locator('[data-testid=job-event]').filter({ hasText: 'job.completed' }).waitFor();
    await state.filter({ hasText: 'completed' }).waitFor();
    await page.locator('[data-testid=job-result]').filter({ hasText: '320' }).waitFor();
    await clean();
  }],

  ['the dead letter page retries one job', async () => {
    await open('/dead-letter');
    for (const id of seeded.dead) await page.locator(`[data-testid=job-row][data-job-id="${id}"]`).waitFor();
    await clean();
    await shot('dead-letter');
    const id = seeded.dead[0];
    await page.locator(`[data-testid=job-row][data-job-id="${id}"] [data-testid=dlq-retry]`).click();
    await page.locator(`[data-testid=job-row][data-job-id="${id}"]`).waitFor({ state: 'detached' });
    await eventually(`job ${id} out of the dead letter queue`, async () => {
      const listed = (await get(`/ojs/v1/admin/dead-letter?queue=${MAIL}&per_page=100`)).items.map((j) => j.id);
      return !listed.includes(id);
    });
    const state = (await get(`/ojs/v1/admin/jobs/${id}`)).state;
    expect(state === 'available', `the retried job is ${state}, not available`);
    await clean();
  }],

  ['the dead letter page deletes one job and retries the selected ones', async () => {
    const [, gone, ...rest] = seeded.dead;
    await page.locator(`[data-testid=job-row][data-job-id="${gone}"] [data-testid=dlq-delete]`).click();
    await page.locator('[data-testid=dialog-ok]').click();
    await page.locator(`[data-testid=job-row][data-job-id="${gone}"]`).waitFor({ state: 'detached' });
    for (const id of rest) await page.locator(`[data-testid=job-row][data-job-id="${id}"] [data-testid=select-job]`).check();
    await page.locator('[data-testid=dlq-retry-selected]').click();
    await page.locator('[data-testid=message]').filter({ hasText: `Retried ${rest.length} of ${rest.length}` }).waitFor();
    const listed = (await get(`/ojs/v1/admin/dead-letter?queue=${MAIL}&per_page=100`)).items.map((j) => j.id);
    expect(!listed.length, `still in the dead letter queue: ${listed.join(', ')}`);
    for (const id of rest) {
      const state = (await get(`/ojs/v1/admin/jobs/${id}`)).state;
      expect(state === 'available', `bulk-retried job ${id} is ${state}`);
    }
    await clean();
  }],

  ['a queue is paused, resumed and purged from its page, and shows its bound', async () => {
    await call('PUT', `/ojs/v1/admin/queues/${IMAGES}/config`, { backpressure: { max_depth: 100 } });
    await open(`/queues/${IMAGES}`);
    await page.locator('[data-testid=queue-bound]').filter({ hasText: 'of 100 places taken (reject)' }).waitFor();
    await page.locator('[data-testid=queue-pause]').click();
    await page.locator('[data-testid=queue-resume]').waitFor();
    expect((await queue(IMAGES)).paused === true, `${IMAGES} is not paused after Pause`);
    await page.locator('[data-testid=queue-resume]').click();
    await page.locator('[data-testid=queue-pause]').waitFor();
    expect((await queue(IMAGES)).paused === false, `${IMAGES} is still paused after Resume`);

    expect((await queue(IMAGES)).counts.completed === 2, `${IMAGES} does not have its 2 completed jobs`);
    await page.locator('[data-testid=queue-purge]').click();
    await page.locator('[data-testid=purge-state-completed]').check();
    await page.locator('[data-testid=dialog-ok]').click();
    await page.locator('[data-testid=message]').filter({ hasText: 'Purged 2 jobs' }).waitFor();
    expect((await queue(IMAGES)).counts.completed === 0, `${IMAGES} still has completed jobs after the purge`);
    await clean();
  }],

  ['a job enqueued over HTTP appears on the open queue page without a reload', async () => {
    await open(`/queues/${BULK}`);
    await page.locator('[data-testid=job-row]').first().waitFor();
    await page.locator('[data-testid=live-status][data-state=live]').waitFor();
    await page.evaluate(() => { window.__samePage = true; });
    const started = performance.now();
    const { job } = await post('/ojs/v1/jobs', { type: 'report.build', args: [{ report: 'on-demand' }], options: { queue: BULK } });
    await page.locator(`[data-testid=job-row][data-job-id="${job.id}"]`).waitFor();
    console.log(`   the new job appeared after ${(performance.now() - started).toFixed(0)} ms`);
    const top = await page.locator('[data-testid=job-row]').first().getAttribute('data-job-id');
    expect(top === job.id, 'the new job is not the first row');
    expect(await page.evaluate(() => window.__samePage === true), 'the page was reloaded');
    await page.locator('[data-testid=queue-count-available]').filter({ hasText: (BULK_JOBS + 1).toLocaleString('en-US') }).waitFor();
    await clean();
  }],

  ['the workers, cron, job search and workflow pages render', async () => {
    await open('/workers');
    await page.locator('[data-testid=page-workers] [data-testid=worker-summary] .card').first().waitFor();
    await open('/cron');
    const next = page.locator('[data-testid=cron-row][data-cron="nightly-report"] [data-testid=cron-next]');
    await next.waitFor();
    expect(/\d{4}-\d\d-\d\d/.test(await next.textContent()), 'the cron entry shows no next run');
    await open(`/jobs?queue=${MAIL}`);
    const found = (await get(`/ojs/v1/admin/jobs?queue=${MAIL}`)).pagination.total;
    await page.locator('[data-testid=jobs-range]').filter({ hasText: new RegExp(` of ${found}$`) }).waitFor();
    await open(`/workflows/${seeded.workflow}`);
    await page.locator('[data-testid=workflow-step]').nth(1).waitFor();
    await clean();
  }],
];

// ---------------------------------------------------------------------------------------

async function main() {
  if (!base) {
    console.error('dashboard test: set OJS_URL to the gateway, e.g. http://127.0.0.1:8080');
    process.exit(2);
  }
  await mkdir(screenshots, { recursive: true });
  browser = await chromium.launch({
    executablePath: chromiumBin,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  page.setDefaultTimeout(10_000);
  page.on('pageerror', (e) => pageErrors.push(e.message));
  page.on('console', (m) => {
    // Failed requests are logged by the browser itself; the checks look at what the page shows.
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) pageErrors.push(m.text());
  });

  let passed = 0;
  let failed = 0;
  for (const [name, run] of checks) {
    if (failed) break;
    const started = performance.now();
    try {
      await run();
      passed += 1;
      console.log(`ok - ${name} (${(performance.now() - started).toFixed(0)} ms)`);
    } catch (e) {
      failed += 1;
      console.error(`FAILED - ${name}: ${e.message}`);
      const where = path.join(tmpdir(), 'ojs-dashboard-failure.png');
      await page.screenshot({ path: where }).then(() => console.error(`   the page at that moment: ${where} (${page.url()})`), () => {});
    }
  }
  await browser.close();
  console.log(`dashboard: ${passed} passed, ${failed} failed, ${checks.length - passed - failed} skipped`);
  process.exit(failed ? 1 : 0);
}

main().catch(async (e) => {
  console.error(`dashboard test: ${e.stack || e.message}`);
  if (browser) await browser.close().catch(() => {});
  process.exit(1);
});
