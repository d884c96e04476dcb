// The live view page: noVNC's RFB client on the websocket a LiveView
// token opens. The path and the one-time token come in the URL's
// fragment (#path=…&token=…), which the browser never sends to a server,
// and are dropped from the address bar once read.
import RFB from '@novnc/novnc/lib/rfb.js';

const status = document.getElementById('status');
const params = new URLSearchParams(location.hash.slice(1));
const path = params.get('path') || '';
const token = params.get('token') || '';
history.replaceState(null, '', location.pathname);

function show(text, cls) {
  status.textContent = text;
  status.className = cls;
}

if (!path.startsWith('/v1/liveview/') || !token) {
  show('no live view: open the URL that `corral live-view` prints', 'error');
} else {
  const scheme = location.protocol === 'https:' ? 'wss://' : 'ws://';
  const rfb = new RFB(document.getElementById('screen'),
    scheme + location.host + path + '?token=' + encodeURIComponent(token), { wsProtocols: ['binary'] });
  rfb.scaleViewport = true;
  show('connecting…', 'muted');
  rfb.addEventListener('connect', () => show('connected: ' + path.slice('/v1/liveview/'.length), 'ok'));
  rfb.addEventListener('disconnect', (e) => show(e.detail.clean ? 'disconnected' : 'connection lost (the token is used once: ask for a new one)', 'error'));
}
