// TALOS people's web app: one script for every page (body[data-page]).
//
// Rules this file keeps (the page's Content-Security-Policy and Trusted
// Types enforce the first two):
// - no markup from data: every text the server sends is put in with
//   textContent / append(string); elements are made here, by name;
// - no inline script or style, nothing from another origin;
// - one request at a time (`request` queues them): a session cookie
//   rotated by one answer is the one the next request carries;
// - no password anywhere: passkeys only (navigator.credentials).
'use strict';

(() => {
  const page = document.body.dataset.page;
  let csrf = null;
  let queue = Promise.resolve();

  // ---- encoding -------------------------------------------------------

  function b64u(buffer) {
    const bytes = new Uint8Array(buffer);
    let bin = '';
    for (let i = 0; i < bytes.length; i += 1) bin += String.fromCharCode(bytes[i]);
    return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  }

  function unb64u(text) {
    const b64 = text.replace(/-/g, '+').replace(/_/g, '/');
    const bin = atob(b64 + '==='.slice((b64.length + 3) % 4));
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i += 1) out[i] = bin.charCodeAt(i);
    return out;
  }

  // ---- requests -------------------------------------------------------

  function request(method, path, body) {
    const run = async () => {
      const init = { method, credentials: 'same-origin', cache: 'no-store', headers: {} };
      if (method !== 'GET') {
        init.headers['Content-Type'] = 'application/json';
        if (csrf) init.headers['X-CSRF-Token'] = csrf;
        init.body = JSON.stringify(body || {});
      }
      let r;
      try {
        r = await fetch(path, init);
      } catch (e) {
        return { ok: false, status: 0, data: { error: 'network', message: 'The server could not be reached.' } };
      }
      let data = null;
      try {
        data = await r.json();
      } catch (e) {
        data = null;
      }
      return { ok: r.ok, status: r.status, data: data || {} };
    };
    const p = queue.then(run, run);
    queue = p.catch(() => undefined);
    return p;
  }

  // ---- elements -------------------------------------------------------

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (v === true) e.setAttribute(k, '');
      else e.setAttribute(k, String(v));
    }
    for (const kid of kids) {
      if (kid === null || kid === undefined) continue;
      e.append(kid);
    }
    return e;
  }

  const MARK_TITLES = {
    control: 'a control character',
    bidi: 'a direction-changing character',
    invisible: 'an invisible character',
    combining: 'a combining mark',
    non_ascii: 'a character beyond ASCII',
  };

  // A field the server made safe to show (people::text::Shown): plain
  // runs as text, each marked character as a badge with its code point
  // (beside the character itself for a look-alike).
  function pieces(shown, extraClass) {
    const span = el('span', { class: 'pieces' + (extraClass ? ' ' + extraClass : '') });
    if (!shown || !Array.isArray(shown.pieces)) return span;
    for (const p of shown.pieces) {
      if (p.t === 'text') {
        span.append(String(p.s));
      } else {
        if (typeof p.ch === 'string') span.append(el('span', { class: 'marked' }, p.ch));
        span.append(el('span', { class: 'mark', title: MARK_TITLES[p.class] || 'a marked character' }, '[' + String(p.cp) + ']'));
      }
    }
    return span;
  }

  function $(id) {
    return document.getElementById(id);
  }

  // The page has done what it does on load (tests and screenshots wait
  // for it).
  function ready() {
    document.body.dataset.ready = 'yes';
  }

  function say(text, kind) {
    const s = $('status');
    if (!s) return;
    s.className = kind || '';
    s.textContent = text;
  }

  function failed(r, what) {
    const msg = (r.data && r.data.message) || ('The server answered ' + r.status + '.');
    say((what ? what + ': ' : '') + msg, 'error');
  }

  function clockText(ms) {
    if (ms <= 0) return 'expired';
    const s = Math.ceil(ms / 1000);
    return Math.floor(s / 60) + ':' + String(s % 60).padStart(2, '0');
  }

  function when(text) {
    if (!text) return '';
    const d = new Date(text);
    return Number.isNaN(d.getTime()) ? String(text) : d.toLocaleString();
  }

  // ---- passkeys -------------------------------------------------------

  function requestOptions(pk) {
    return {
      challenge: unb64u(pk.challenge),
      rpId: pk.rpId,
      timeout: pk.timeout,
      userVerification: 'required',
      allowCredentials: (pk.allowCredentials || []).map((c) => ({ type: 'public-key', id: unb64u(c.id) })),
    };
  }

  function assertionJson(cred) {
    const r = cred.response;
    return {
      id: b64u(cred.rawId),
      response: {
        authenticatorData: b64u(r.authenticatorData),
        clientDataJSON: b64u(r.clientDataJSON),
        signature: b64u(r.signature),
        userHandle: r.userHandle ? b64u(r.userHandle) : null,
      },
    };
  }

  async function sign(publicKey) {
    try {
      const cred = await navigator.credentials.get({ publicKey: requestOptions(publicKey) });
      return cred ? assertionJson(cred) : null;
    } catch (e) {
      return null;
    }
  }

  // ---- signed-in pages ------------------------------------------------

  async function signedIn() {
    const r = await request('GET', '/api/me');
    if (!r.ok || !r.data.signed_in) {
      location.replace('/');
      return null;
    }
    csrf = r.data.csrf;
    const nav = $('nav');
    if (nav) {
      nav.hidden = false;
      for (const a of nav.querySelectorAll('a')) {
        if (location.pathname === a.getAttribute('href') || location.pathname.startsWith(a.getAttribute('href') + '/')) {
          a.setAttribute('aria-current', 'page');
        }
      }
    }
    const out = $('sign-out');
    if (out) {
      out.hidden = false;
      out.addEventListener('click', async () => {
        await request('POST', '/api/sign-out', {});
        location.assign('/');
      });
    }
    return r.data;
  }

  // ---- sign-in --------------------------------------------------------

  async function signInPage() {
    const me = await request('GET', '/api/me');
    if (me.ok && me.data.signed_in) {
      location.replace('/cards');
      return;
    }
    const button = $('sign-in');
    button.addEventListener('click', async () => {
      button.disabled = true;
      say('Use your passkey…');
      const begun = await request('POST', '/api/sign-in/begin', {});
      if (!begun.ok) {
        failed(begun, 'Sign-in');
        button.disabled = false;
        return;
      }
      const credential = await sign(begun.data.publicKey);
      if (!credential) {
        say('No passkey was used. Try again.', 'error');
        button.disabled = false;
        return;
      }
      const done = await request('POST', '/api/sign-in/finish', { challenge_id: begun.data.challenge_id, credential });
      if (!done.ok) {
        failed(done, 'Sign-in');
        button.disabled = false;
        return;
      }
      say('Signed in as ' + done.data.person + '.', 'good');
      location.assign('/cards');
    });
    ready();
  }

  // ---- enrolment ------------------------------------------------------

  async function enrolPage() {
    const token = location.hash.slice(1);
    // The token leaves the address bar and the history at once.
    history.replaceState(null, '', '/enrol');
    const who = $('who');
    const button = $('enrol');
    if (!token) {
      who.textContent = 'This page needs the enrolment link you were sent, whole.';
      ready();
      return;
    }
    let options = null;
    let fetchedAt = 0;
    const begin = async () => {
      const r = await request('POST', '/api/enrol/begin', { token });
      if (!r.ok) {
        failed(r, 'This enrolment link');
        who.textContent = 'This link cannot be used.';
        button.hidden = true;
        return false;
      }
      options = r.data;
      fetchedAt = performance.now();
      return true;
    };
    if (!(await begin())) {
      ready();
      return;
    }
    who.textContent = '';
    who.append('You are creating the passkey of ', el('strong', {}, String(options.person)), ' (' + String(options.role) + ').');
    button.hidden = false;
    button.addEventListener('click', async () => {
      button.disabled = true;
      if (performance.now() - fetchedAt > 60000 && !(await begin())) return;
      const pk = options.publicKey;
      say('Create the passkey on your device…');
      let cred;
      try {
        cred = await navigator.credentials.create({
          publicKey: {
            rp: pk.rp,
            user: { id: unb64u(pk.user.id), name: pk.user.name, displayName: pk.user.displayName },
            challenge: unb64u(pk.challenge),
            pubKeyCredParams: pk.pubKeyCredParams,
            timeout: pk.timeout,
            excludeCredentials: pk.excludeCredentials.map((c) => ({ type: 'public-key', id: unb64u(c.id) })),
            authenticatorSelection: pk.authenticatorSelection,
            attestation: pk.attestation,
          },
        });
      } catch (e) {
        cred = null;
      }
      if (!cred) {
        say('No passkey was created. Try again.', 'error');
        button.disabled = false;
        return;
      }
      const done = await request('POST', '/api/enrol/finish', {
        token,
        challenge_id: options.challenge_id,
        credential: {
          id: b64u(cred.rawId),
          response: {
            attestationObject: b64u(cred.response.attestationObject),
            clientDataJSON: b64u(cred.response.clientDataJSON),
          },
        },
      });
      if (!done.ok) {
        failed(done, 'Enrolment');
        button.disabled = false;
        return;
      }
      button.hidden = true;
      say('Your passkey is saved. Sign in with it now.', 'good');
      $('next').hidden = false;
    });
    ready();
  }

  // ---- cards ----------------------------------------------------------

  function digestView(digest) {
    const text = String(digest);
    const short = text.slice(0, 12) + '…' + text.slice(-8);
    return el('details', { class: 'digest' },
      el('summary', {}, el('span', { class: 'mono' }, short), ' (SHA-384, show all)'),
      el('code', {}, text));
  }

  function field(dl, name, value) {
    dl.append(el('dt', {}, name), el('dd', {}, value));
  }

  function warningsView(warnings) {
    if (!warnings || warnings.length === 0) return null;
    const list = el('ul', {});
    for (const w of warnings) list.append(el('li', {}, String(w)));
    return el('div', { class: 'warn', role: 'note' }, el('strong', {}, 'Look closely before you decide. This card holds:'), list);
  }

  function cardTitle(c) {
    const h = el('h2', { id: 'card-title-' + c.seq });
    if (c.kind === 'agent') h.append('Agent tool: ', pieces(c.tool));
    else h.append(pieces(c.method), ' ', pieces(c.path));
    return h;
  }

  function cardView(c, allow, rpId) {
    const dl = el('dl', { class: 'fields' });
    field(dl, 'Session', el('a', { href: '/sessions/' + encodeURIComponent(c.session_id) }, pieces(c.session)));
    field(dl, 'Tenant', pieces(c.tenant));
    field(dl, 'Rule', pieces(c.rule));
    if (c.kind === 'agent') {
      field(dl, 'Tool', pieces(c.tool));
      field(dl, 'Call', pieces(c.call_digest, 'mono'));
    } else {
      field(dl, 'Destination', pieces(c.destination));
      field(dl, 'Method', pieces(c.method));
      field(dl, 'Path', pieces(c.path));
    }
    const timer = el('span', { class: 'timer' }, clockText(c.expires_in_ms));
    field(dl, 'Time left', timer);
    field(dl, 'Digest', digestView(c.digest));
    const result = el('p', { role: 'status', 'aria-live': 'polite' });
    const approve = el('button', { type: 'button', class: 'primary approve' }, 'Approve');
    const decline = el('button', { type: 'button', class: 'danger decline' }, 'Decline');
    const article = el('article', { class: 'card', 'aria-labelledby': 'card-title-' + c.seq, 'data-card': c.id },
      cardTitle(c),
      el('p', { class: 'sentence' }, pieces(c.sentence)),
      warningsView(c.warnings),
      dl,
      el('div', { class: 'actions' }, approve, decline),
      result);
    const decide = async (verdict) => {
      // Kept on the page while it is decided here: the live stream drops
      // the card from the list as soon as the decision is stored, which
      // can come before the answer to this page's own request.
      article.dataset.deciding = verdict;
      approve.disabled = true;
      decline.disabled = true;
      result.className = '';
      result.textContent = 'Confirm with your passkey…';
      const credential = await sign({
        challenge: c.challenges[verdict],
        rpId,
        timeout: 90000,
        allowCredentials: allow,
      });
      if (!credential) {
        result.className = 'error';
        result.textContent = 'No passkey was used: nothing was decided.';
        delete article.dataset.deciding;
        approve.disabled = false;
        decline.disabled = false;
        return;
      }
      const r = await request('POST', '/api/cards/' + encodeURIComponent(c.id) + '/decision', { verdict, credential });
      if (!r.ok) {
        result.className = 'error';
        result.textContent = (r.data && r.data.message) || ('The server answered ' + r.status + '.');
        if (r.status !== 409 && r.status !== 403) {
          delete article.dataset.deciding;
          approve.disabled = false;
          decline.disabled = false;
        }
        return;
      }
      article.dataset.decided = verdict;
      result.className = 'good';
      result.textContent = (verdict === 'approved' ? 'Approved' : 'Declined') + ', signed with your passkey: the gateway ' +
        (r.data.outcome === 'released' ? 'let the request go on.' : 'refused the request.');
    };
    approve.addEventListener('click', () => decide('approved'));
    decline.addEventListener('click', () => decide('declined'));
    return { article, timer, approve, decline, card: c, at: performance.now() };
  }

  async function cardsPage() {
    if (!(await signedIn())) return;
    const box = $('cards');
    const shown = new Map();
    let seq = 0;
    const render = (data) => {
      const cards = data.cards || [];
      const allow = data.allow_credentials || [];
      const ids = new Set(cards.map((c) => c.id));
      for (const [id, v] of shown) {
        if (!ids.has(id) && !v.article.dataset.decided && !v.article.dataset.deciding) {
          v.article.remove();
          shown.delete(id);
        }
      }
      for (const c of cards) {
        if (shown.has(c.id)) continue;
        seq += 1;
        c.seq = seq;
        const v = cardView(c, allow, data.rp_id);
        shown.set(c.id, v);
        box.append(v.article);
      }
      say(cards.length === 0 ? 'No card waits for you.' : (cards.length === 1 ? 'One card waits for you.' : cards.length + ' cards wait for you.'));
      ready();
    };
    setInterval(() => {
      const now = performance.now();
      for (const v of shown.values()) {
        const left = v.card.expires_in_ms - (now - v.at);
        v.timer.textContent = clockText(left);
        if (left <= 0 && !v.article.dataset.decided) {
          v.approve.disabled = true;
          v.decline.disabled = true;
        }
      }
    }, 1000);
    let polling = null;
    const poll = async () => {
      const r = await request('GET', '/api/cards');
      if (r.ok) render(r.data);
    };
    const events = new EventSource('/api/events');
    events.addEventListener('cards', (e) => {
      try {
        render(JSON.parse(e.data));
      } catch (err) {
        say('A card list could not be read.', 'error');
      }
    });
    events.addEventListener('signed_out', () => {
      events.close();
      say('Your session is over. Sign in again.', 'error');
      location.assign('/');
    });
    events.addEventListener('error', () => {
      if (events.readyState === EventSource.CLOSED && polling === null) {
        polling = setInterval(poll, 3000);
        poll();
      }
    });
    notifications();
  }

  // ---- notifications (Web Push) ----------------------------------------

  async function notifications() {
    const section = $('notify');
    if (!section || !('serviceWorker' in navigator) || !('PushManager' in window) || !('Notification' in window)) return;
    const r = await request('GET', '/api/push');
    if (!r.ok || !r.data.public_key) return;
    section.hidden = false;
    const button = $('notify-on');
    const status = $('notify-status');
    const url = window.trustedTypes
      ? window.trustedTypes.createPolicy('talos', {
        createScriptURL: (u) => {
          if (u !== '/sw.js') throw new TypeError('only the app\'s own service worker');
          return u;
        },
      }).createScriptURL('/sw.js')
      : '/sw.js';
    button.addEventListener('click', async () => {
      button.disabled = true;
      try {
        const permission = await Notification.requestPermission();
        if (permission !== 'granted') {
          status.textContent = 'Notifications are not allowed for this page.';
          button.disabled = false;
          return;
        }
        const reg = await navigator.serviceWorker.register(url, { scope: '/' });
        const ready = await navigator.serviceWorker.ready;
        const sub = (await ready.pushManager.getSubscription()) ||
          (await ready.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: unb64u(r.data.public_key) }));
        const j = sub.toJSON();
        const saved = await request('POST', '/api/push/subscribe', { endpoint: j.endpoint, keys: { p256dh: j.keys.p256dh, auth: j.keys.auth } });
        status.textContent = saved.ok ? 'Notifications are on for this device.' : ((saved.data && saved.data.message) || 'The subscription was refused.');
        if (!reg) button.disabled = false;
      } catch (e) {
        status.textContent = 'Notifications could not be turned on here: ' + String(e && e.message ? e.message : e);
        button.disabled = false;
      }
    });
  }

  // ---- sessions -------------------------------------------------------

  async function sessionsPage() {
    if (!(await signedIn())) return;
    const r = await request('GET', '/api/sessions');
    if (!r.ok) {
      failed(r);
      return;
    }
    const list = $('sessions');
    const sessions = r.data.sessions || [];
    ready();
    say(sessions.length === 0 ? 'No session to show.' : '');
    for (const s of sessions) {
      list.append(el('li', {},
        el('a', { href: '/sessions/' + encodeURIComponent(s.id) }, pieces(s.shown_id, 'mono')),
        ' ', el('span', { class: 'badge' }, String(s.state)),
        el('div', { class: 'fine' }, 'Tenant ', pieces(s.tenant), ' · mode ' + String(s.mode) + ' · started ' + when(s.created_at) +
          (s.cards_waiting ? ' · ' + s.cards_waiting + ' card(s) waiting' : ''))));
    }
  }

  function table(head, rows) {
    const t = el('table', {});
    const tr = el('tr', {});
    for (const h of head) tr.append(el('th', { scope: 'col' }, h));
    t.append(el('thead', {}, tr));
    const body = el('tbody', {});
    for (const row of rows) {
      const r = el('tr', {});
      for (const cell of row) r.append(el('td', {}, cell));
      body.append(r);
    }
    t.append(body);
    return t;
  }

  async function sessionPage() {
    if (!(await signedIn())) return;
    const id = decodeURIComponent(location.pathname.split('/')[2] || '');
    const box = $('session');
    const load = async () => {
      const r = await request('GET', '/api/sessions/' + encodeURIComponent(id));
      if (!r.ok) {
        failed(r);
        return;
      }
      box.replaceChildren();
      const d = r.data;
      const s = d.session;
      const title = $('title');
      title.replaceChildren('Session ', pieces(s.shown_id, 'mono'));
      say('');
      const state = el('dl', { class: 'fields' });
      field(state, 'State', String(s.state));
      field(state, 'Tenant', pieces(s.tenant));
      field(state, 'Mode', String(s.mode));
      field(state, 'Started', when(s.created_at));
      if (s.ended_at) field(state, 'Ended', when(s.ended_at) + (s.end_reason ? ' (' + s.end_reason + ')' : ''));
      box.append(el('section', { class: 'block', 'aria-labelledby': 's-state' }, el('h2', { id: 's-state' }, 'State'), state, warningsView(d.warnings)));

      const revoke = el('section', { class: 'block', 'aria-labelledby': 's-revoke' }, el('h2', { id: 's-revoke' }, 'Revoke All'));
      if (d.can_revoke) {
        const result = el('p', { role: 'status', 'aria-live': 'polite' });
        const open = el('button', { type: 'button', class: 'danger', id: 'revoke-open' }, 'Revoke All…');
        const go = el('button', { type: 'button', class: 'danger primary', id: 'revoke-confirm' }, 'Revoke All with your passkey');
        const cancel = el('button', { type: 'button', id: 'revoke-cancel' }, 'Cancel');
        const confirm = el('div', { class: 'confirm', hidden: true },
          el('p', {}, 'Revoke All ends this session now: its connections are cut, its held requests withdrawn, the gateways drop its certificate authority and secrets. It cannot be undone.'),
          el('div', { class: 'actions' }, go, cancel));
        open.addEventListener('click', () => {
          confirm.hidden = false;
          open.hidden = true;
          go.focus();
        });
        cancel.addEventListener('click', () => {
          confirm.hidden = true;
          open.hidden = false;
          open.focus();
        });
        go.addEventListener('click', async () => {
          go.disabled = true;
          cancel.disabled = true;
          result.className = '';
          result.textContent = 'Confirm with your passkey…';
          const begun = await request('POST', '/api/sessions/' + encodeURIComponent(id) + '/revoke-all/begin', {});
          if (!begun.ok) {
            result.className = 'error';
            result.textContent = begun.data.message || 'Refused.';
            go.disabled = false;
            cancel.disabled = false;
            return;
          }
          const credential = await sign(begun.data.publicKey);
          if (!credential) {
            result.className = 'error';
            result.textContent = 'No passkey was used: nothing was revoked.';
            go.disabled = false;
            cancel.disabled = false;
            return;
          }
          const done = await request('POST', '/api/sessions/' + encodeURIComponent(id) + '/revoke-all', { nonce: begun.data.nonce, credential });
          if (!done.ok) {
            result.className = 'error';
            result.textContent = done.data.message || 'Refused.';
            go.disabled = false;
            cancel.disabled = false;
            return;
          }
          await load();
          say('Revoked: the session is ' + String(done.data.state) + '. The record names you, verified by your passkey.', 'good');
        });
        revoke.append(el('p', {}, 'End this session at once, for everyone.'), open, confirm, result);
      } else {
        revoke.append(el('p', { class: 'fine' }, s.state === 'ended' || s.state === 'reset_incomplete' || s.state === 'stopping'
          ? 'This session is over.'
          : 'Only an operator can revoke a session.'));
      }
      box.append(revoke);

      const c = d.connections;
      const refusals = Object.entries(c.refused || {}).map(([k, v]) => [el('code', {}, k), String(v)]);
      const reqRefusals = Object.entries(c.requests_refused || {}).map(([k, v]) => [el('code', {}, k), String(v)]);
      box.append(el('section', { class: 'block', 'aria-labelledby': 's-conn' }, el('h2', { id: 's-conn' }, 'Connections'),
        el('p', {}, String(c.total) + ' connection(s) in the accepted batches: ' + String(c.allowed) + ' allowed, ' +
          String(c.total - c.allowed) + ' refused; ' + String(c.requests) + ' request(s).'),
        refusals.length ? table(['Connection refusal', 'Count'], refusals) : null,
        reqRefusals.length ? table(['Request refusal', 'Count'], reqRefusals) : null));

      const held = el('section', { class: 'block', 'aria-labelledby': 's-held' }, el('h2', { id: 's-held' }, 'Held requests'));
      if (!d.held.length) held.append(el('p', { class: 'fine' }, 'No request is held.'));
      const heldList = el('ul', { class: 'list' });
      for (const h of d.held) {
        heldList.append(el('li', {}, el('p', { class: 'sentence' }, pieces(h.sentence)), warningsView(h.warnings),
          el('div', { class: 'fine' }, 'Time left ' + clockText(h.expires_in_ms) + ' · ', h.yours ? el('a', { href: '/cards' }, 'decide on Cards') : 'waits for ' + h.approvers.map((a) => a.escaped).join(' or '))));
      }
      held.append(heldList);
      box.append(held);

      const attempts = el('section', { class: 'block', 'aria-labelledby': 's-att' }, el('h2', { id: 's-att' }, 'Attempts'));
      for (const a of d.attempts) {
        attempts.append(el('h3', {}, 'Attempt ' + String(a.n) + ' (' + String(a.cause) + ')'),
          el('p', { class: 'fine' }, 'Started ' + when(a.started_at) + (a.ended_at ? ' · ended ' + when(a.ended_at) + ' (' + String(a.end_cause) + ')' : '')),
          table(['Gateway', 'CA digest', 'Made', 'Destroyed'], a.cas.map((ca) => [
            String(ca.gateway_id), digestView(ca.digest), when(ca.made_at),
            ca.destroyed_at ? when(ca.destroyed_at) + ' (' + String(ca.destroy_reason) + ')' : 'not yet']).concat([])));
      }
      box.append(attempts);

      const reset = el('section', { class: 'block', 'aria-labelledby': 's-reset' }, el('h2', { id: 's-reset' }, 'Reset steps'));
      if (!d.reset.length) reset.append(el('p', { class: 'fine' }, 'The reset runs when the session ends.'));
      else {
        reset.append(table(['Step', 'Outcomes'], d.reset.map((r) => [
          String(r.step) + '. ' + String(r.name),
          el('ul', {}, ...r.outcomes.map((o) => el('li', {}, (o.confirmed ? 'confirmed' : 'not confirmed') + ' · ' + when(o.at) + (o.error ? ' · ' + String(o.error) : '')))),
        ])));
      }
      box.append(reset);

      const commands = el('section', { class: 'block', 'aria-labelledby': 's-cmd' }, el('h2', { id: 's-cmd' }, 'Who asked'));
      commands.append(table(['Command', 'By', 'When'], d.commands.map((cmd) => [
        String(cmd.event),
        el('span', {}, String(cmd.requester) + ' ', pieces(cmd.requested_by), ' ',
          el('span', { class: 'badge ' + (cmd.verified ? 'verified' : 'unverified') }, !cmd.verified ? 'not verified' : cmd.verified_by === 'client_certificate' ? 'verified by client certificate' : 'verified by passkey')),
        when(cmd.at)])));
      box.append(commands);
    };
    await load();
    ready();
  }

  // ---- history --------------------------------------------------------

  async function historyPage() {
    if (!(await signedIn())) return;
    const r = await request('GET', '/api/history');
    if (!r.ok) {
      failed(r);
      return;
    }
    const list = $('history');
    const items = r.data.decisions || [];
    ready();
    say(items.length === 0 ? 'You have decided nothing yet.' : '');
    for (const d of items) {
      list.append(el('li', {},
        el('span', { class: 'badge' }, String(d.state)), ' ',
        el('span', { class: 'fine' }, when(d.decided_at) + ' · the gateway ' + (d.outcome === 'released' ? 'let it go on' : 'refused it')),
        d.signed_with_passkey ? el('span', { class: 'badge verified' }, 'signed with your passkey') : null,
        el('p', { class: 'sentence' }, pieces(d.sentence)),
        el('div', {}, el('a', { href: '/sessions/' + encodeURIComponent(d.session_id) }, 'Session page'), ' · ', digestView(d.digest))));
    }
  }

  const pages = {
    'sign-in': signInPage,
    enrol: enrolPage,
    cards: cardsPage,
    sessions: sessionsPage,
    session: sessionPage,
    history: historyPage,
  };
  const run = pages[page];
  if (run) run();
})();
