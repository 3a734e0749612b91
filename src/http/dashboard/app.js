// The ojs-jetstream dashboard: plain DOM, no build step. Every value from the server enters
// the page as text (h() below), never as markup.
'use strict';

const STATES = ['available', 'active', 'scheduled', 'pending', 'retryable', 'completed', 'discarded', 'cancelled'];
const TERMINAL = new Set(['completed', 'discarded', 'cancelled']);
const PER_PAGE = 20;
// Live updates re-fetch at most this often, however many events arrive.
const LIVE_THROTTLE_MS = 500;
const KEY_STORE = 'ojs-dashboard.api-key';
// The API sits beside the dashboard (/ojs/admin/ → /ojs/v1/), so a proxy that mounts the
// gateway under a prefix keeps working.
const API = new URL('../v1/', location.href);
// What the overview and list pages follow; a job's own page follows everything of that job.
const LIVE_TYPES = [
  'job.enqueued', 'job.scheduled', 'job.state_changed', 'queue.paused', 'queue.resumed',
  'workflow.started', 'workflow.step_completed', 'workflow.completed', 'workflow.failed',
];

const numbers = new Intl.NumberFormat('en-US', { maximumFractionDigits: 2 });
const enc = encodeURIComponent;

// ---------------------------------------------------------------------------------------
// DOM helpers

// Replaces an element's content: nodes, and anything else as text; nested arrays are
// flattened, null and false left out, so that optional parts can be written inline.
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c != null && c !== false)
    .map((c) => (c instanceof Node ? c : String(c))));
}

// An element with attributes (`on…` for listeners; null and false leave one out) and content.
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value == null || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else if (key === 'class') el.className = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  fill(el, children);
  return el;
}

const $ = (selector) => document.querySelector(selector);
const num = (n) => (typeof n === 'number' ? numbers.format(n) : '—');
const json = (value) => h('pre', { class: 'json' }, JSON.stringify(value, null, 2));

function pad(n) {
  return String(n).padStart(2, '0');
}

function time(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const text = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `
    + `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return h('time', { datetime: iso, title: iso }, text);
}

function span(seconds) {
  const s = Math.abs(Math.round(seconds));
  return s < 90 ? `${s} s` : s < 5400 ? `${Math.round(s / 60)} min`
    : s < 172800 ? `${Math.round(s / 3600)} h` : `${Math.round(s / 86400)} d`;
}

function ago(iso) {
  const seconds = (Date.now() - new Date(iso).getTime()) / 1000;
  return seconds >= 0 ? `${span(seconds)} ago` : `in ${span(seconds)}`;
}

// A relative time that init()'s ticker keeps current without asking the server.
function relative(iso) {
  if (!iso) return '—';
  return h('time', { datetime: iso, title: iso, 'data-ago': iso }, ago(iso));
}

function badge(state) {
  return h('span', { class: `state state-${state}`, 'data-testid': 'state' }, state || '—');
}

function button(label, onclick, props = {}) {
  return h('button', { type: 'button', ...props, onclick }, label);
}

// A throttled call: at most one run per `ms`, the last request always served.
function throttle(fn, ms) {
  let last = 0;
  let timer = null;
  return () => {
    if (timer) return;
    timer = setTimeout(() => {
      timer = null;
      last = Date.now();
      fn();
    }, Math.max(0, last + ms - Date.now()));
  };
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

// ---------------------------------------------------------------------------------------
// Notices, the API key and the API

// An error stays until dismissed; a success note goes by itself.
function notify(message, ok = false) {
  const box = h('div', { class: ok ? 'notice ok' : 'notice error', role: ok ? 'status' : 'alert', 'data-testid': ok ? 'message' : 'error' },
    h('span', {}, message),
    button('×', () => box.remove(), { class: 'link', 'aria-label': 'Dismiss' }));
  $('#notices').append(box);
  if (ok) setTimeout(() => box.remove(), 6000);
}

function apiKey() {
  try {
    return localStorage.getItem(KEY_STORE) || '';
  } catch {
    return '';
  }
}

function setApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORE, key);
    else localStorage.removeItem(KEY_STORE);
  } catch {
    notify('This browser does not let the page keep the API key (localStorage is blocked).');
  }
}

function authHeaders(extra) {
  const headers = { Accept: 'application/json', ...extra };
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

function showSettings(open) {
  $('#settings').hidden = !open;
  $('[data-testid=api-key-toggle]').setAttribute('aria-expanded', String(open));
  if (open) $('[data-testid=api-key-input]').focus();
}

function needKey(message) {
  const banner = $('[data-testid=auth-banner]');
  banner.textContent = apiKey()
    ? `The server refused the API key: ${message} Enter another under “API key”.`
    : `This server needs an API key: enter it under “API key”. (${message})`;
  banner.hidden = false;
  showSettings(true);
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// The OJS error body's message, or the HTTP status when the body has none.
async function errorOf(res, what) {
  let message = `${what}: HTTP ${res.status}`;
  try {
    const body = await res.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch {
    // Not JSON: the status line says enough.
  }
  if (res.status === 401) needKey(message);
  return new ApiError(res.status, message);
}

async function api(path, { method = 'GET', body, signal } = {}) {
  const headers = authHeaders(body === undefined ? {} : { 'Content-Type': 'application/json' });
  let res;
  try {
    res = await fetch(new URL(path, API), {
      method, headers, signal, cache: 'no-store',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, `The server cannot be reached (${e.message}).`);
  }
  if (!res.ok) throw await errorOf(res, `${method} ${path}`);
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

// Reports a failed request; a page that was left meanwhile, or a missing key (the banner
// already says so), is no news.
function report(e) {
  if (e.name === 'AbortError' || e.status === 401) return;
  notify(e.message);
}

// ---------------------------------------------------------------------------------------
// Server-Sent Events over fetch(), so that the API key goes along as a header

async function readSse(body, onEvent, onId, onRetry) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let name = '';
  let data = [];
  const line = (text) => {
    if (text === '') {
      if (data.length) onEvent(name || 'message', data.join('\n'));
      name = '';
      data = [];
      return;
    }
    if (text.startsWith(':')) return;
    const colon = text.indexOf(':');
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? '' : text.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') data.push(value);
    else if (field === 'event') name = value;
    else if (field === 'id' && !value.includes('\0')) onId(value);
    else if (field === 'retry' && /^\d+$/.test(value)) onRetry(Number(value));
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    for (;;) {
      const i = buffer.search(/[\r\n]/);
      // A CR at the very end may be the first half of a CRLF.
      if (i < 0 || (buffer[i] === '\r' && i === buffer.length - 1)) break;
      line(buffer.slice(0, i));
      buffer = buffer.slice(i + (buffer[i] === '\r' && buffer[i + 1] === '\n' ? 2 : 1));
    }
  }
}

// One event, whether a stored event (`data` holds the job's fields) or a state-change notice.
function normalize(type, text) {
  const payload = JSON.parse(text);
  if (type === 'job.state_changed') {
    return { type, jobId: payload.job_id, queue: payload.queue, jobType: payload.type,
      from: payload.from, state: payload.to, time: payload.timestamp, data: payload };
  }
  const d = (payload && payload.data) || {};
  return {
    type, jobId: d.job_id, queue: d.queue, jobType: d.job_type, state: d.state,
    from: d.previous_state, time: payload.time, workflowId: d.workflow_id, data: d,
    // A job's first event has no previous state; later enqueues (retries) do.
    isNew: (type === 'job.enqueued' || type === 'job.scheduled') && !d.previous_state,
  };
}

// Follows an event stream, reconnecting with Last-Event-ID so that nothing is missed;
// `until()` true ends it when the server closes the stream.
function follow(path, { onEvent, onStatus = () => {}, until = () => false }) {
  const ctrl = new AbortController();
  let lastId = null;
  let retry = 3000;
  (async () => {
    while (!ctrl.signal.aborted) {
      try {
        const headers = authHeaders({ Accept: 'text/event-stream' });
        if (lastId !== null) headers['Last-Event-ID'] = lastId;
        const res = await fetch(new URL(path, API), { headers, signal: ctrl.signal, cache: 'no-store' });
        if (!res.ok) {
          const err = await errorOf(res, 'The event stream');
          // Asking again cannot help a refused request; an unknown job's page says so itself.
          if (res.status < 500 && res.status !== 429) {
            if (res.status !== 401 && res.status !== 404) notify(err.message);
            onStatus('offline');
            return;
          }
          throw err;
        }
        onStatus('live');
        await readSse(res.body, (type, text) => {
          try {
            onEvent(normalize(type, text));
          } catch (e) {
            console.error('event stream:', type, e);
          }
        }, (id) => { lastId = id; }, (ms) => { retry = ms; });
        if (until()) return;
      } catch {
        if (ctrl.signal.aborted) return;
      }
      onStatus('reconnecting');
      await sleep(retry, ctrl.signal);
    }
  })();
  return { stop: () => ctrl.abort() };
}

function setLive(state) {
  const el = $('[data-testid=live-status]');
  el.dataset.state = state;
  el.textContent = state;
}

let liveStream = null;

function startLive() {
  if (liveStream) liveStream.stop();
  liveStream = follow(`events/stream?event_types=${LIVE_TYPES.join(',')}`, {
    onStatus: setLive,
    onEvent: (ev) => {
      // Events were lost to the stream's retention: start the page afresh.
      if (ev.type === 'system.gap') route();
      else if (current && current.onEvent) current.onEvent(ev);
    },
  });
}

// ---------------------------------------------------------------------------------------
// Dialogs

// A modal confirmation; resolves true for OK.
function ask(title, body, okLabel, danger = false) {
  return new Promise((resolve) => {
    const dialog = h('dialog', { 'data-testid': 'dialog' },
      h('form', { method: 'dialog' },
        h('h2', {}, title),
        body,
        h('menu', {},
          h('button', { value: 'cancel', 'data-testid': 'dialog-cancel' }, 'Cancel'),
          h('button', { value: 'ok', class: danger ? 'danger' : null, 'data-testid': 'dialog-ok' }, okLabel))));
    dialog.addEventListener('close', () => {
      dialog.remove();
      resolve(dialog.returnValue === 'ok');
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

// ---------------------------------------------------------------------------------------
// A paged jobs table, shared by the queue page, the job search and the dead letter queue

const SINCE = {
  available: 'enqueued_at', active: 'started_at', scheduled: 'scheduled_at',
  completed: 'completed_at', discarded: 'discarded_at', cancelled: 'cancelled_at',
};

// `filter` ({queue, state, type}) is what the listed jobs share, `params` what `path` is
// asked. Live events update listed jobs' states in place and re-read the newest page when
// a job enters the list.
function jobsTable(ctx, { path, filter, params = filter, showQueue = true, selectable = false, actions = null }) {
  const rows = new Map();
  const tbody = h('tbody');
  const range = h('span', { class: 'muted', 'data-testid': 'jobs-range' });
  const stale = h('button', { type: 'button', class: 'link', hidden: true, 'data-testid': 'jobs-stale', onclick: () => load(null) }, 'New jobs: show the newest');
  const first = button('Newest', () => load(null), { 'data-testid': 'jobs-first', disabled: true });
  const next = button('Next page', () => load(cursor), { 'data-testid': 'jobs-next', disabled: true });
  const all = selectable && h('input', {
    type: 'checkbox', 'aria-label': 'Select all', 'data-testid': 'select-all',
    onchange: () => {
      for (const row of rows.values()) row.box.checked = all.checked;
      changed();
    },
  });
  const head = h('tr', {},
    selectable && h('th', { class: 'pick' }, all),
    h('th', {}, 'ID'), h('th', {}, 'Type'), showQueue && h('th', {}, 'Queue'), h('th', {}, 'State'),
    h('th', { class: 'num' }, 'Attempt'), h('th', { class: 'num' }, 'Priority'),
    h('th', {}, 'Created'), h('th', {}, 'Since'), actions && h('th', {}, ''));
  const columns = head.children.length;
  const el = h('div', { class: 'jobs' },
    h('table', { class: 'grid', 'data-testid': 'jobs-table' }, h('thead', {}, head), tbody),
    h('div', { class: 'pager' }, range, stale, first, next));
  const asked = Object.fromEntries(Object.entries(params).filter(([, v]) => v));
  let cursor = null;
  let page = 0;
  let total = 0;
  let shown = 0;
  let onSelection = () => {};

  function changed() {
    onSelection([...rows.values()].filter((r) => r.box && r.box.checked).map((r) => r.id));
  }

  function showRange() {
    const start = page * PER_PAGE;
    range.textContent = shown ? `${num(start + 1)}–${num(start + shown)} of ${num(total)}` : `0 of ${num(total)}`;
  }

  function row(job, fresh) {
    const box = selectable && h('input', { type: 'checkbox', 'aria-label': `Select ${job.id}`, 'data-testid': 'select-job', onchange: changed });
    const state = badge(job.state);
    const since = job[SINCE[job.state]];
    const tr = h('tr', { 'data-testid': 'job-row', 'data-job-id': job.id, class: fresh ? 'fresh' : null },
      selectable && h('td', { class: 'pick' }, box),
      h('td', { class: 'mono' }, h('a', { href: `#/jobs/${enc(job.id)}`, 'data-testid': 'job-link' }, job.id)),
      h('td', {}, job.type),
      showQueue && h('td', {}, h('a', { href: `#/queues/${enc(job.queue)}` }, job.queue)),
      h('td', { 'data-testid': 'job-state' }, state),
      h('td', { class: 'num' }, `${job.attempt ?? 0}/${job.max_attempts ?? '—'}`),
      h('td', { class: 'num' }, job.priority ?? 0),
      h('td', {}, time(job.created_at)),
      h('td', {}, since ? relative(since) : '—'),
      actions && h('td', { class: 'actions' }, actions(job)));
    rows.set(job.id, { id: job.id, tr, box, state });
    return tr;
  }

  function empty() {
    if (!rows.size) fill(tbody, h('tr', {}, h('td', { colspan: columns, class: 'muted empty', 'data-testid': 'jobs-empty' }, 'No jobs.')));
  }

  // `live`: the newest page again after jobs entered the list; new rows are marked and
  // ticked boxes stay ticked.
  async function load(from, live = false) {
    const query = new URLSearchParams(asked);
    query.set('per_page', String(PER_PAGE));
    if (from) query.set('cursor', from);
    const before = new Set(rows.keys());
    const ticked = new Set([...rows.values()].filter((r) => r.box && r.box.checked).map((r) => r.id));
    try {
      const body = await api(`${path}?${query}`, ctx);
      page = from ? page + 1 : 0;
      rows.clear();
      stale.hidden = true;
      fill(tbody, body.items.map((job) => row(job, live && !before.has(job.id))));
      empty();
      for (const r of rows.values()) if (r.box) r.box.checked = live && ticked.has(r.id);
      if (all) all.checked = false;
      changed();
      cursor = body.pagination && body.pagination.next_cursor;
      next.disabled = !cursor;
      first.disabled = page === 0;
      total = (body.pagination && body.pagination.total) || 0;
      shown = body.items.length;
      showRange();
    } catch (e) {
      report(e);
    }
  }

  const reload = throttle(() => load(null, true), LIVE_THROTTLE_MS);

  function onEvent(ev) {
    if (!ev.jobId || !ev.state) return;
    const job = { queue: ev.queue, state: ev.state, type: ev.jobType };
    const known = rows.get(ev.jobId);
    if (known) {
      if (ev.state === known.state.textContent) return;
      const state = badge(ev.state);
      known.state.replaceWith(state);
      known.state = state;
      // Left the list (a state filter): dimmed, not removed, so that nothing jumps.
      known.tr.classList.toggle('left', !fits(job, filter));
      return;
    }
    // A job enters the list when it is created, or when it reaches the listed state; the
    // newest page shows it at once, a later page offers the way back.
    const enters = ev.isNew || (filter.state && ev.from && ev.from !== filter.state);
    if (!enters || !fits(job, filter)) return;
    if (page === 0) reload();
    else stale.hidden = false;
  }

  return {
    el, load, onEvent,
    remove(id) {
      const known = rows.get(id);
      if (!known) return;
      known.tr.remove();
      rows.delete(id);
      total -= 1;
      shown -= 1;
      showRange();
      empty();
      changed();
    },
    onSelect(fn) { onSelection = fn; },
  };
}

// Whether a job (or an event's job) fits a jobs filter.
function fits(job, { queue, state, type }) {
  return (!queue || job.queue === queue) && (!state || job.state === state) && (!type || job.type === type);
}

// ---------------------------------------------------------------------------------------
// Pages

function page(testid, title, ...children) {
  return h('section', { class: 'page', 'data-testid': testid }, h('h1', {}, title), children);
}

function card(label, value, testid) {
  return h('div', { class: 'card', 'data-testid': testid }, h('span', { class: 'label' }, label), h('span', { class: 'value' }, value));
}

function overviewView(ctx) {
  const cards = h('div', { class: 'cards', 'data-testid': 'stats' });
  const tbody = h('tbody');
  const el = page('page-overview', 'Overview', cards,
    h('h2', {}, 'Queues'),
    h('table', { class: 'grid', 'data-testid': 'queues-table' },
      h('thead', {}, h('tr', {},
        h('th', {}, 'Queue'), h('th', {}, 'State'),
        STATES.map((s) => h('th', { class: 'num' }, s)),
        h('th', { class: 'num', title: 'Jobs finished per minute' }, 'done/min'),
        h('th', { class: 'num', title: 'Failed attempts per minute' }, 'failed/min'))),
      tbody));

  async function load() {
    const [stats, queues] = await Promise.all([api('admin/stats', ctx), api('admin/queues?per_page=100', ctx)]);
    const jobs = stats.jobs || {};
    const throughput = stats.throughput || {};
    fill(cards,
      card('Queues', num(stats.queues), 'stat-queues'),
      card('Workers', h('a', { href: '#/workers' }, num(stats.workers)), 'stat-workers'),
      STATES.map((s) => card(s, num(jobs[s]), `stat-${s}`)),
      card('Done / min', num(throughput.processed_per_minute), 'stat-processed'),
      card('Failed / min', num(throughput.failed_per_minute), 'stat-failed'),
      card('Up', stats.uptime_seconds == null ? '—' : span(stats.uptime_seconds), 'stat-uptime'));
    fill(tbody, ...queues.items.map((q) => h('tr', { 'data-testid': 'queue-row', 'data-queue': q.name },
      h('td', {}, h('a', { href: `#/queues/${enc(q.name)}`, 'data-testid': 'queue-link' }, q.name)),
      h('td', {}, badge(q.paused ? 'paused' : 'active')),
      STATES.map((s) => h('td', { class: 'num', 'data-testid': `count-${s}` }, num((q.counts || {})[s]))),
      h('td', { class: 'num' }, num((q.throughput || {}).processed_per_minute)),
      h('td', { class: 'num' }, num((q.throughput || {}).failed_per_minute)))));
    if (!queues.items.length) tbody.append(h('tr', {}, h('td', { colspan: STATES.length + 4, class: 'muted empty' }, 'No queues yet: enqueue a job to create one.')));
    const total = queues.pagination && queues.pagination.total;
    if (total > queues.items.length) tbody.append(h('tr', {}, h('td', { colspan: STATES.length + 4, class: 'muted' }, `${num(queues.items.length)} of ${num(total)} queues shown.`)));
  }

  const refresh = throttle(() => load().catch(report), LIVE_THROTTLE_MS);
  load().catch(report);
  return { el, title: 'Overview', onEvent: refresh };
}

function queueView(ctx, name) {
  const state = STATES.includes(ctx.query.get('state')) ? ctx.query.get('state') : '';
  const heading = h('h1', {}, `Queue ${name} `);
  const toggle = h('button', { type: 'button', disabled: true }, 'Pause');
  const purge = button('Purge…', () => purgeDialog(), { class: 'danger', 'data-testid': 'queue-purge' });
  const tabs = h('nav', { class: 'tabs', 'data-testid': 'state-tabs' });
  const facts = h('p', { class: 'muted', 'data-testid': 'queue-facts' });
  const config = h('details', { class: 'config' });
  const table = jobsTable(ctx, {
    path: 'admin/jobs',
    filter: { queue: name, state },
    showQueue: false,
  });
  const el = h('section', { class: 'page', 'data-testid': 'page-queue', 'data-queue': name },
    heading, h('div', { class: 'toolbar' }, toggle, purge), tabs, facts, table.el, config);
  let detail = null;

  function render(q) {
    detail = q;
    fill(heading, `Queue ${q.name} `, badge(q.paused ? 'paused' : 'active'));
    toggle.textContent = q.paused ? 'Resume' : 'Pause';
    toggle.disabled = false;
    toggle.dataset.testid = q.paused ? 'queue-resume' : 'queue-pause';
    const counts = q.counts || {};
    const tab = (label, s, count) => h('a', {
      href: `#/queues/${enc(name)}${s ? `?state=${s}` : ''}`,
      'aria-current': s === state ? 'page' : null,
      'data-testid': `state-tab-${s || 'all'}`,
    }, label, count == null ? null : h('span', { class: 'count', 'data-testid': `queue-count-${s}` }, num(count)));
    fill(tabs, tab('all', '', null), ...STATES.map((s) => tab(s, s, counts[s])));
    const t = q.throughput || {};
    const bound = (q.configuration || {}).backpressure;
    fill(facts,
      bound ? h('span', { 'data-testid': 'queue-bound' },
        `${num(bound.depth)} of ${num(bound.max_depth)} places taken (${bound.strategy}) · `) : null,
      `${num(t.processed_per_minute)} done/min · ${num(t.failed_per_minute)} failed/min · `,
      h('a', { href: `#/dead-letter?queue=${enc(name)}` }, `${num(q.dead_letter)} in the dead letter queue`),
      q.paused && q.paused_at ? [' · paused ', relative(q.paused_at)] : null,
      q.created_at ? [' · created ', time(q.created_at)] : null);
    fill(config, h('summary', {}, 'Configuration'), json(q.configuration || {}));
  }

  const loadDetail = () => api(`admin/queues/${enc(name)}`, ctx).then(render);
  const refresh = throttle(() => loadDetail().catch(report), LIVE_THROTTLE_MS);

  toggle.addEventListener('click', async () => {
    toggle.disabled = true;
    try {
      await api(`admin/queues/${enc(name)}/${detail && detail.paused ? 'resume' : 'pause'}`, { method: 'POST' });
      await loadDetail();
    } catch (e) {
      report(e);
    } finally {
      toggle.disabled = false;
    }
  });

  async function purgeDialog() {
    const counts = (detail && detail.counts) || {};
    const boxes = STATES.map((s) => h('input', { type: 'checkbox', value: s, 'data-testid': `purge-state-${s}`, checked: s === 'completed' }));
    const ok = await ask(`Purge jobs of ${name}`, [
      h('p', {}, 'Deletes the queue’s jobs in the chosen states for good.'),
      h('div', { class: 'choices' }, boxes.map((box, i) => h('label', {}, box, ` ${STATES[i]} (${num(counts[STATES[i]])})`))),
    ], 'Purge', true);
    const states = boxes.filter((b) => b.checked).map((b) => b.value);
    if (!ok) return;
    if (!states.length) {
      notify('Choose at least one state to purge.');
      return;
    }
    try {
      const res = await api(`admin/queues/${enc(name)}/jobs`, { method: 'DELETE', body: { states, confirm: true } });
      notify(`Purged ${num(res.purged_count)} jobs (${(res.states || states).join(', ')}).`, true);
      await Promise.all([loadDetail(), table.load(null)]);
    } catch (e) {
      report(e);
    }
  }

  loadDetail().catch(report);
  table.load(null);
  return {
    el, title: `Queue ${name}`,
    onEvent(ev) {
      if (ev.queue !== name) return;
      refresh();
      table.onEvent(ev);
    },
  };
}

function jobsView(ctx) {
  const filter = { queue: ctx.query.get('queue') || '', state: ctx.query.get('state') || '', type: ctx.query.get('type') || '' };
  const input = (label, key, extra) => h('label', {}, label, h('input', { name: key, value: filter[key], 'data-testid': `search-${key}`, ...extra }));
  const form = h('form', { class: 'filters', 'data-testid': 'job-search' },
    input('Queue', 'queue', { placeholder: 'any' }),
    h('label', {}, 'State', h('select', { name: 'state', 'data-testid': 'search-state' },
      h('option', { value: '' }, 'any'),
      STATES.map((s) => h('option', { value: s, selected: s === filter.state }, s)))),
    input('Type', 'type', { placeholder: 'any' }),
    h('button', { type: 'submit', 'data-testid': 'search-submit' }, 'Search'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const query = new URLSearchParams();
    for (const [key, value] of new FormData(form)) if (value.trim()) query.set(key, value.trim());
    location.hash = `#/jobs${query.toString() ? `?${query}` : ''}`;
  });
  const open = h('form', { class: 'filters', 'data-testid': 'open-by-id' },
    h('label', {}, 'ID', h('input', { name: 'id', required: true, placeholder: 'a job or workflow id', 'data-testid': 'open-id' })),
    h('button', { type: 'submit', value: 'job' }, 'Open job'),
    h('button', { type: 'submit', value: 'workflow' }, 'Open workflow'));
  open.addEventListener('submit', (e) => {
    e.preventDefault();
    const id = new FormData(open).get('id').trim();
    location.hash = `#/${e.submitter && e.submitter.value === 'workflow' ? 'workflows' : 'jobs'}/${enc(id)}`;
  });
  const table = jobsTable(ctx, { path: 'admin/jobs', filter });
  table.load(null);
  return { el: page('page-jobs', 'Jobs', form, open, table.el), title: 'Jobs', onEvent: table.onEvent };
}

const TIMES = ['created_at', 'enqueued_at', 'scheduled_at', 'started_at', 'completed_at', 'cancelled_at', 'discarded_at', 'expires_at'];

function jobView(ctx, id) {
  const heading = h('h1', {}, `Job ${id} `);
  const cancel = button('Cancel', () => act('cancel'), { 'data-testid': 'job-cancel' });
  const retry = button('Retry', () => act('retry'), { 'data-testid': 'job-retry' });
  const body = h('div', { class: 'job' });
  const quiet = h('tr', {}, h('td', { colspan: 4, class: 'muted empty' }, 'Nothing yet.'));
  const events = h('tbody', {}, quiet);
  const el = h('section', { class: 'page', 'data-testid': 'page-job', 'data-job-id': id },
    heading, h('div', { class: 'toolbar' }, cancel, retry), body,
    h('h2', {}, 'Events'),
    h('p', { class: 'muted' }, 'The job’s events as they happen while this page is open.'),
    h('table', { class: 'grid', 'data-testid': 'job-events' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Time'), h('th', {}, 'Event'), h('th', {}, 'State'), h('th', {}, 'Details'))),
      events));
  let job = null;
  let ended = false;

  function section(title, content, testid, wide = false) {
    return h('section', { class: wide ? 'part wide' : 'part', 'data-testid': testid }, h('h2', {}, title), content);
  }

  function render(j) {
    job = j;
    fill(heading, `Job ${j.id} `, badge(j.state));
    cancel.disabled = TERMINAL.has(j.state);
    // The states the server retries from.
    retry.disabled = !['discarded', 'retryable'].includes(j.state);
    const facts = [
      ['Type', j.type], ['Queue', h('a', { href: `#/queues/${enc(j.queue)}` }, j.queue)],
      ['Attempt', `${j.attempt ?? 0} of ${j.max_attempts ?? '—'}`], ['Priority', j.priority ?? 0],
      j.worker_id ? ['Worker', j.worker_id] : null,
      j.workflow_id ? ['Workflow', h('a', { href: `#/workflows/${enc(j.workflow_id)}`, 'data-testid': 'job-workflow' }, j.workflow_id)] : null,
      ...TIMES.filter((k) => j[k]).map((k) => [k.replace(/_at$/, '').replace('_', ' '), time(j[k])]),
    ].filter(Boolean);
    const errors = Array.isArray(j.errors) && j.errors.length ? j.errors : j.error ? [j.error] : [];
    fill(body,
      h('dl', { class: 'facts', 'data-testid': 'job-facts' }, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
      j.progress != null ? section('Progress', [
        h('progress', { max: 1, value: j.progress }), ` ${num(j.progress * 100)} %`,
        j.progress_message ? h('p', {}, j.progress_message) : null,
        j.progress_data != null ? json(j.progress_data) : null,
      ], 'job-progress') : null,
      section('Arguments', json(j.args ?? []), 'job-args'),
      section('Meta', json(j.meta ?? {}), 'job-meta'),
      j.result != null ? section('Result', json(j.result), 'job-result') : null,
      errors.length ? section('Errors', h('table', { class: 'grid' },
        h('thead', {}, h('tr', {}, h('th', { class: 'num' }, 'Attempt'), h('th', {}, 'Code'), h('th', {}, 'Message'), h('th', {}, 'When'))),
        h('tbody', {}, errors.map((e) => h('tr', { 'data-testid': 'job-error' },
          h('td', { class: 'num' }, e.attempt ?? '—'), h('td', {}, e.code || e.type || '—'),
          h('td', {}, e.message || ''), h('td', {}, time(e.occurred_at || e.at)))))), 'job-errors', true) : null,
      h('details', {}, h('summary', {}, 'Full envelope'), json(j)));
  }

  const load = () => api(`admin/jobs/${enc(id)}`, ctx).then(render);
  const refresh = throttle(() => load().catch(report), LIVE_THROTTLE_MS);

  async function act(action) {
    if (action === 'cancel' && !await ask('Cancel this job?', h('p', {}, `${job.type} in ${job.queue}`), 'Cancel job', true)) return;
    try {
      const res = await api(`admin/jobs/${enc(id)}/${action}`, { method: 'POST' });
      render(res.job);
      if (action === 'retry') watch();
      notify(action === 'cancel' ? 'Job cancelled.' : 'Job retried.', true);
    } catch (e) {
      report(e);
    }
  }

  function detail(d) {
    const parts = [];
    if (d.attempt != null) parts.push(`attempt ${d.attempt}`);
    if (d.worker_id) parts.push(`worker ${d.worker_id}`);
    if (d.progress_percent != null) parts.push(`${num(d.progress_percent)} %`);
    const error = d.error || d.last_error;
    if (error && error.message) parts.push(error.message);
    if (d.next_retry_at) parts.push(`next try ${d.next_retry_at}`);
    if (d.from) parts.push(`from ${d.from}`);
    return parts.join(' · ');
  }

  let stream = null;
  // A retried job lives again: follow it afresh.
  function watch() {
    if (stream) stream.stop();
    ended = false;
    stream = follow(`jobs/${enc(id)}/events`, {
      until: () => ended || (job != null && TERMINAL.has(job.state)),
      onEvent(ev) {
        ended = ended || TERMINAL.has(ev.state);
        quiet.remove();
        events.prepend(h('tr', { 'data-testid': 'job-event' },
          h('td', {}, time(ev.time)), h('td', {}, ev.type), h('td', {}, ev.state ? badge(ev.state) : '—'), h('td', {}, detail(ev.data))));
        refresh();
      },
    });
  }

  watch();
  load().catch(report);
  return { el, title: `Job ${id}`, dispose: () => stream.stop() };
}

function deadLetterView(ctx) {
  const queue = ctx.query.get('queue') || '';
  const form = h('form', { class: 'filters' },
    h('label', {}, 'Queue', h('input', { name: 'queue', value: queue, placeholder: 'any', 'data-testid': 'dlq-queue' })),
    h('button', { type: 'submit' }, 'Filter'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const q = new FormData(form).get('queue').trim();
    location.hash = `#/dead-letter${q ? `?queue=${enc(q)}` : ''}`;
  });
  let selected = [];
  const retrySelected = button('Retry selected', () => bulkRetry(), { 'data-testid': 'dlq-retry-selected', disabled: true });
  const table = jobsTable(ctx, {
    path: 'admin/dead-letter',
    filter: { queue, state: 'discarded' },
    params: { queue },
    selectable: true,
    actions: (job) => [
      button('Retry', () => retryOne(job), { 'data-testid': 'dlq-retry' }),
      button('Delete', () => deleteOne(job), { class: 'danger', 'data-testid': 'dlq-delete' }),
    ],
  });
  table.onSelect((ids) => {
    selected = ids;
    retrySelected.disabled = !ids.length;
    retrySelected.textContent = ids.length ? `Retry selected (${ids.length})` : 'Retry selected';
  });

  async function retryOne(job) {
    try {
      await api(`admin/dead-letter/${enc(job.id)}/retry`, { method: 'POST' });
      table.remove(job.id);
      notify(`Retried ${job.id}.`, true);
    } catch (e) {
      report(e);
    }
  }

  async function deleteOne(job) {
    if (!await ask('Delete this job for good?', h('p', {}, `${job.type} in ${job.queue}: ${job.id}`), 'Delete', true)) return;
    try {
      await api(`admin/dead-letter/${enc(job.id)}`, { method: 'DELETE' });
      table.remove(job.id);
      notify(`Deleted ${job.id}.`, true);
    } catch (e) {
      report(e);
    }
  }

  async function bulkRetry() {
    const ids = selected;
    try {
      const res = await api('admin/jobs/bulk/retry', { method: 'POST', body: { job_ids: ids, confirm: true } });
      notify(`Retried ${num(res.succeeded)} of ${num(res.matched)} jobs.`, !res.failed);
      for (const failure of res.errors || []) notify(`${failure.job_id}: ${failure.error && failure.error.message ? failure.error.message : failure.error}`);
      await table.load(null);
    } catch (e) {
      report(e);
    }
  }

  table.load(null);
  return {
    el: page('page-dead-letter', 'Dead letter', h('div', { class: 'toolbar' }, form, retrySelected), table.el),
    title: 'Dead letter',
    onEvent: table.onEvent,
  };
}

function workersView(ctx) {
  const cards = h('div', { class: 'cards', 'data-testid': 'worker-summary' });
  const tbody = h('tbody');
  const el = page('page-workers', 'Workers', cards,
    h('table', { class: 'grid', 'data-testid': 'workers-table' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Worker'), h('th', {}, 'Host'), h('th', {}, 'State'), h('th', {}, 'Queues'),
        h('th', { class: 'num' }, 'Active jobs'), h('th', {}, 'Started'), h('th', {}, 'Last heartbeat'), h('th', {}, ''))),
      tbody));

  async function command(worker, action) {
    if (action !== 'quiet' && !await ask(action === 'terminate' ? 'Stop this worker?' : 'Forget this worker?',
      h('p', {}, action === 'terminate' ? `${worker.id} stops after its next heartbeat.` : `${worker.id} is removed from the list.`),
      action === 'terminate' ? 'Terminate' : 'Forget', true)) return;
    try {
      await api(`admin/workers/${enc(worker.id)}${action === 'remove' ? '' : `/${action}`}`, { method: action === 'remove' ? 'DELETE' : 'POST' });
      await load();
    } catch (e) {
      report(e);
    }
  }

  async function load() {
    const body = await api('admin/workers?per_page=100', ctx);
    const s = body.summary || {};
    fill(cards, card('Total', num(s.total), 'workers-total'), card('Running', num(s.running), 'workers-running'),
      card('Quiet', num(s.quiet), 'workers-quiet'), card('Stale', num(s.stale), 'workers-stale'));
    fill(tbody, ...body.items.map((w) => h('tr', { 'data-testid': 'worker-row', 'data-worker-id': w.id },
      h('td', { class: 'mono' }, w.id), h('td', {}, w.hostname || '—'), h('td', {}, badge(w.state)),
      h('td', {}, (w.queues || []).join(', ') || '—'), h('td', { class: 'num' }, num(w.active_jobs)),
      h('td', {}, time(w.started_at)), h('td', {}, relative(w.last_heartbeat_at)),
      h('td', { class: 'actions' },
        button('Quiet', () => command(w, 'quiet'), { 'data-testid': 'worker-quiet', disabled: w.state !== 'running' }),
        button('Terminate', () => command(w, 'terminate'), { class: 'danger', 'data-testid': 'worker-terminate', disabled: w.state === 'terminate' || w.state === 'stale' }),
        w.state === 'stale' ? button('Forget', () => command(w, 'remove'), { 'data-testid': 'worker-remove' }) : null))));
    if (!body.items.length) tbody.append(h('tr', {}, h('td', { colspan: 8, class: 'muted empty' }, 'No worker has fetched jobs yet.')));
  }

  const refresh = throttle(() => load().catch(report), LIVE_THROTTLE_MS);
  load().catch(report);
  // Active job counts change as jobs start and finish.
  return { el, title: 'Workers', onEvent: (ev) => { if (ev.type === 'job.state_changed') refresh(); } };
}

function cronView(ctx) {
  const tbody = h('tbody');
  const el = page('page-cron', 'Cron',
    h('table', { class: 'grid', 'data-testid': 'cron-table' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', {}, 'Schedule'), h('th', {}, 'Job type'), h('th', {}, 'Queue'),
        h('th', {}, 'Status'), h('th', {}, 'Next run'), h('th', {}, 'Last run'), h('th', { class: 'num' }, 'Runs'), h('th', {}, 'Last job'))),
      tbody));

  async function load() {
    const body = await api('cron?limit=1000', ctx);
    const entries = body.crons || body.cron_jobs || [];
    fill(tbody, ...entries.map((c) => {
      const template = c.job_template || {};
      const options = template.options || {};
      return h('tr', { 'data-testid': 'cron-row', 'data-cron': c.name },
        h('td', {}, c.name, c.description ? h('div', { class: 'muted' }, c.description) : null),
        h('td', { class: 'mono' }, c.expression || c.cron, h('div', { class: 'muted' }, c.timezone || 'UTC')),
        h('td', {}, template.type || c.type || '—'),
        h('td', {}, options.queue || 'default'),
        h('td', {}, badge(c.status || (c.enabled ? 'active' : 'paused'))),
        h('td', { 'data-testid': 'cron-next' }, c.next_run_at ? [time(c.next_run_at), ' ', h('span', { class: 'muted' }, '(', relative(c.next_run_at), ')')] : '—'),
        h('td', {}, c.last_run_at ? relative(c.last_run_at) : '—'),
        h('td', { class: 'num' }, num(c.run_count)),
        h('td', { class: 'mono' }, c.last_job_id ? h('a', { href: `#/jobs/${enc(c.last_job_id)}` }, c.last_job_id) : '—'));
    }));
    if (!entries.length) tbody.append(h('tr', {}, h('td', { colspan: 9, class: 'muted empty' }, 'No cron entries.')));
    if (body.count > entries.length) tbody.append(h('tr', {}, h('td', { colspan: 9, class: 'muted' }, `${num(entries.length)} of ${num(body.count)} entries shown.`)));
  }

  const refresh = throttle(() => load().catch(report), LIVE_THROTTLE_MS);
  load().catch(report);
  // A tick enqueues a job and moves the entry's next run.
  return { el, title: 'Cron', onEvent: (ev) => { if (ev.isNew) refresh(); } };
}

function workflowView(ctx, id) {
  const heading = h('h1', {}, `Workflow ${id}`);
  const body = h('div');
  const el = h('section', { class: 'page', 'data-testid': 'page-workflow', 'data-workflow-id': id }, heading, body);
  let members = new Set();

  async function load() {
    const res = await api(`workflows/${enc(id)}`, ctx);
    const w = res.workflow || res;
    const steps = w.steps || [];
    members = new Set(steps.map((s) => s.job_id).filter(Boolean));
    for (const c of Object.values(w.callbacks || {})) if (c.job_id) members.add(c.job_id);
    const stepRow = (label, s) => h('tr', { 'data-testid': 'workflow-step' },
      h('td', { class: 'num' }, label), h('td', { class: 'mono' }, s.id || '—'), h('td', {}, s.type || '—'), h('td', {}, badge(s.state)),
      h('td', { class: 'mono' }, s.job_id ? h('a', { href: `#/jobs/${enc(s.job_id)}` }, s.job_id) : 'not enqueued yet'));
    fill(heading, `${w.type || 'Workflow'} ${w.name || w.id} `, badge(w.state));
    fill(body,
      h('dl', { class: 'facts', 'data-testid': 'workflow-facts' },
        h('dt', {}, 'ID'), h('dd', { class: 'mono' }, w.id),
        h('dt', {}, 'Steps'), h('dd', {}, h('progress', { max: w.steps_total || 1, value: w.steps_completed || 0 }),
          ` ${num(w.steps_completed)} of ${num(w.steps_total)} done, ${num(w.jobs_failed)} failed`),
        h('dt', {}, 'Created'), h('dd', {}, time(w.created_at)),
        h('dt', {}, 'Started'), h('dd', {}, time(w.started_at)),
        h('dt', {}, 'Finished'), h('dd', {}, time(w.completed_at)),
        w.parent_workflow_id ? [h('dt', {}, 'Parent'), h('dd', {}, h('a', { href: `#/workflows/${enc(w.parent_workflow_id)}` }, w.parent_workflow_id))] : null),
      w.error ? h('section', { class: 'part' }, h('h2', {}, 'Failure'), json(w.error)) : null,
      h('h2', {}, 'Steps'),
      h('table', { class: 'grid', 'data-testid': 'workflow-steps' },
        h('thead', {}, h('tr', {}, h('th', { class: 'num' }, '#'), h('th', {}, 'Step'), h('th', {}, 'Type'), h('th', {}, 'State'), h('th', {}, 'Job'))),
        h('tbody', {}, steps.map((s) => stepRow(s.index, s)),
          Object.entries(w.callbacks || {}).map(([name, c]) => stepRow(name, c)))));
  }

  const refresh = throttle(() => load().catch(report), LIVE_THROTTLE_MS);
  load().catch(report);
  return {
    el, title: `Workflow ${id}`,
    onEvent: (ev) => { if (ev.workflowId === id || members.has(ev.jobId)) refresh(); },
  };
}

function notFoundView() {
  return { el: page('page-not-found', 'Not found', h('p', {}, 'No such page. '), h('a', { href: '#/' }, 'Back to the overview')), title: 'Not found' };
}

// ---------------------------------------------------------------------------------------
// Routing: #/path?query

const ROUTES = [
  [/^\/$/, 'overview', overviewView],
  [/^\/queues\/([^/]+)$/, 'overview', queueView],
  [/^\/jobs$/, 'jobs', jobsView],
  [/^\/jobs\/([^/]+)$/, 'jobs', jobView],
  [/^\/dead-letter$/, 'dead-letter', deadLetterView],
  [/^\/workers$/, 'workers', workersView],
  [/^\/cron$/, 'cron', cronView],
  [/^\/workflows\/([^/]+)$/, 'jobs', workflowView],
];

let current = null;
let leave = null;

function route() {
  if (leave) leave.abort();
  if (current && current.dispose) current.dispose();
  leave = new AbortController();
  $('#notices').replaceChildren();
  const raw = location.hash.replace(/^#/, '') || '/';
  const q = raw.indexOf('?');
  const path = q < 0 ? raw : raw.slice(0, q);
  const ctx = { signal: leave.signal, query: new URLSearchParams(q < 0 ? '' : raw.slice(q + 1)) };
  let section = null;
  current = null;
  for (const [pattern, nav, view] of ROUTES) {
    const m = pattern.exec(path);
    if (!m) continue;
    try {
      current = view(ctx, ...m.slice(1).map(decodeURIComponent));
      section = nav;
    } catch (e) {
      if (!(e instanceof URIError)) throw e;
    }
    break;
  }
  current = current || notFoundView();
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (a.dataset.nav === section) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.title = `${current.title} · ojs-jetstream`;
  $('#view').replaceChildren(current.el);
}

function init() {
  const settings = $('#settings');
  const input = $('[data-testid=api-key-input]');
  input.value = apiKey();
  $('[data-testid=api-key-toggle]').addEventListener('click', () => showSettings(settings.hidden));
  const saved = (key) => {
    setApiKey(key);
    input.value = key;
    $('[data-testid=auth-banner]').hidden = true;
    showSettings(false);
    startLive();
    route();
  };
  settings.addEventListener('submit', (e) => {
    e.preventDefault();
    saved(input.value.trim());
  });
  $('[data-testid=api-key-clear]').addEventListener('click', () => saved(''));
  window.addEventListener('hashchange', route);
  setInterval(() => {
    for (const el of document.querySelectorAll('[data-ago]')) el.textContent = ago(el.dataset.ago);
  }, 5000);
  route();
  startLive();
}

init();
