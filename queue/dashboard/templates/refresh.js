// Reloads the page every data-refresh seconds, except while the reader is
// in a form field or the tab is hidden. Without JavaScript, the page's
// <noscript> meta refresh reloads it instead.
(function () {
  var every = Number(document.body.getAttribute('data-refresh') || 5) * 1000;
  // Drop a POST's message from the address, so a reload does not repeat it.
  var u = new URL(location.href);
  ['retried', 'failed', 'gone', 'removed'].forEach(function (k) { u.searchParams.delete(k); });
  if (u.href !== location.href) history.replaceState(null, '', u.href);
  // A removal cannot be undone: the reader confirms it. (Without
  // JavaScript, the button removes at once.)
  document.addEventListener('submit', function (e) {
    var f = e.target;
    if (!f.classList.contains('rm')) return;
    if (!confirm('Remove the dead letter of job ' + f.getAttribute('data-id') + '? Its job will not run.')) e.preventDefault();
  });
  setInterval(function () {
    var a = document.activeElement;
    if (document.hidden || (a && (a.tagName === 'INPUT' || a.tagName === 'BUTTON'))) return;
    location.reload();
  }, every);
})();
