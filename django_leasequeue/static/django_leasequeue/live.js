/* Live updates of a django-leasequeue console page (see django_leasequeue/admin/live.py).
 *
 * The bar (.lq-live, from admin/django_leasequeue/_live.html) names the page's JSON endpoint
 * (data-live-url) and the seconds between polls (data-live-interval). Every poll replaces the text
 * of each [data-live="<key>"] element with the answer's value for <key>; nothing else on the page
 * changes, so forms and scroll positions stay. Polls stop while the tab is hidden and while the
 * operator has paused (one state for the whole console, in localStorage).
 */
(function () {
  'use strict';
  var KEY = 'lq-live-paused';

  function isPaused() {
    try { return window.localStorage.getItem(KEY) === '1'; } catch (e) { return false; }
  }

  function setPaused(paused) {
    try {
      if (paused) { window.localStorage.setItem(KEY, '1'); } else { window.localStorage.removeItem(KEY); }
    } catch (e) { /* storage refused (private mode): the button still works for this page */ }
  }

  // "2026-12-03T13:45:02+01:00" -> "13:45:02": the server sends the time in the admin's zone.
  function clock(iso) { return (iso || '').substr(11, 8); }

  function start(bar) {
    var url = bar.getAttribute('data-live-url');
    var seconds = Math.max(2, parseInt(bar.getAttribute('data-live-interval'), 10) || 5);
    var button = bar.querySelector('.lq-live-toggle');
    var status = bar.querySelector('.lq-live-status');
    var reload = bar.querySelector('.lq-live-reload');
    var timer = null;
    var inflight = false;
    var stopped = false;  // a refused poll: no more until Resume or a reload
    var paused = isPaused();
    var updated = clock(bar.getAttribute('data-live-at'));

    function show() {
      button.textContent = paused || stopped ? 'Resume updates' : 'Pause updates';
      button.setAttribute('aria-pressed', paused || stopped ? 'true' : 'false');
      bar.classList.toggle('lq-live-off', paused || stopped);
      if (!stopped) {
        status.textContent = (paused ? 'paused' : 'live every ' + seconds + ' s') + (updated ? ' · updated ' + updated : '');
      }
    }

    function plan() {
      window.clearTimeout(timer);
      timer = null;
      if (!paused && !stopped && !document.hidden) { timer = window.setTimeout(poll, seconds * 1000); }
    }

    function apply(values) {
      var seen = {};
      var changed = false;
      var marked = document.querySelectorAll('[data-live]');
      for (var i = 0; i < marked.length; i++) {
        var el = marked[i];
        var key = el.getAttribute('data-live');
        seen[key] = true;
        if (!Object.prototype.hasOwnProperty.call(values, key)) { changed = true; continue; }
        var text = values[key];
        if (el.textContent !== text) { el.textContent = text; }
        var cls = el.getAttribute('data-live-nonzero');
        if (cls) { el.classList.toggle(cls, text !== '0'); }
        var template = el.getAttribute('data-live-class');  // "lq-status lq-{}": the class follows the text
        if (template && el.getAttribute('class') !== template.replace('{}', text)) {
          el.setAttribute('class', template.replace('{}', text));
          el.style.color = '';  // a colour set with the first text would contradict the new class
        }
      }
      for (var k in values) {
        if (k !== 'at' && Object.prototype.hasOwnProperty.call(values, k) && !seen[k]) { changed = true; }
      }
      reload.hidden = !changed;
    }

    function fail(text, fatal) {
      stopped = fatal;
      bar.classList.add('lq-live-failed');
      show();
      status.textContent = text;
    }

    function poll() {
      timer = null;
      if (inflight || paused || stopped) { return; }
      inflight = true;
      window.fetch(url, {credentials: 'same-origin', cache: 'no-store', headers: {'Accept': 'application/json'}})
        .then(function (response) {
          var type = response.headers.get('Content-Type') || '';
          if (response.status === 403) { throw {fatal: true, text: 'not updated: permission denied; reload the page'}; }
          if (response.ok && type.indexOf('application/json') !== 0) {
            throw {fatal: true, text: 'not updated: logged out; reload the page'};  // the login page
          }
          if (!response.ok) { throw {fatal: false, text: 'update failed (HTTP ' + response.status + '), retrying'}; }
          return response.json();
        })
        .then(function (values) {
          apply(values);
          updated = clock(values.at);
          bar.classList.remove('lq-live-failed');
          show();
        }, function (error) {
          fail(error && error.text ? error.text : 'update failed (no answer), retrying', Boolean(error && error.fatal));
        })
        .then(function () { inflight = false; plan(); });
    }

    button.addEventListener('click', function () {
      if (stopped && !paused) {  // after a refused poll: Resume tries again
        stopped = false;
        bar.classList.remove('lq-live-failed');
        show();
        poll();
        return;
      }
      paused = !paused;
      setPaused(paused);
      if (!paused) { stopped = false; bar.classList.remove('lq-live-failed'); }
      show();
      if (paused) { plan(); } else { poll(); }
    });
    document.addEventListener('visibilitychange', function () {
      if (document.hidden) { plan(); } else if (!paused) { poll(); }
    });
    window.addEventListener('storage', function (event) {  // paused or resumed in another tab
      if (event.key !== KEY && event.key !== null) { return; }
      paused = isPaused();
      show();
      plan();
    });
    bar.hidden = false;
    show();
    plan();
  }

  function init() {
    var bars = document.querySelectorAll('.lq-live[data-live-url]');
    for (var i = 0; i < bars.length; i++) { start(bars[i]); }
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', init);
  } else {
    init();
  }
}());
