// wiretape's Node preload: fetch() and the http/https modules use HTTPS_PROXY and HTTP_PROXY.
//
// `wiretape record/replay -- COMMAND` and `wiretape env` load it with NODE_OPTIONS=--require.
// Node ignores the proxy variables unless NODE_USE_ENV_PROXY=1, which wiretape also sets, and
// even then only from 22.21 (fetch and http/https), 24.0 (fetch) and 24.5 (both) on. This file
// does what the running Node does not do itself, and nothing where Node does it all.
//
// fetch() goes through undici's EnvHttpProxyAgent, from the undici that
// `wiretape shims install node` puts in $WIRETAPE_NODE_MODULES (never a copy of ours). Without
// it, fetch() is left alone and one line on stderr says so. The http and https modules need
// nothing: their default agents are replaced by agents that open a CONNECT tunnel through the
// proxy, for plain-HTTP targets too. Requests with an agent of their own are left alone.
//
// It runs inside the user's program: it depends on nothing of wiretape's, and it never throws.
'use strict';

(function wiretapePreload() {
  const INSTALL = 'wiretape shims install node';
  const loaded = Symbol.for('wiretape.preload');
  if (globalThis[loaded]) return;
  // What routes each API, for `wiretape doctor` to read: 'node', 'undici x.y.z', 'tunnel'.
  const routes = { fetch: null, http: null, https: null };
  globalThis[loaded] = routes;

  const env = process.env;
  const httpsProxy = env.https_proxy || env.HTTPS_PROXY || '';
  const httpProxy = env.http_proxy || env.HTTP_PROXY || '';
  if (!httpsProxy && !httpProxy) return;
  const [major, minor] = process.versions.node.split('.').map(Number);
  const useEnvProxy =
    env.NODE_USE_ENV_PROXY === '1' || process.execArgv.includes('--use-env-proxy');
  // With NODE_USE_ENV_PROXY=1 Node routes fetch() itself from 24.0 on, and http/https from
  // 24.5 on; 22.21 and later 22.x releases have both.
  const nativeFetch = useEnvProxy && (major >= 24 || (major === 22 && minor >= 21));
  const nativeModules =
    useEnvProxy && (major > 24 || (major === 24 && minor >= 5) || (major === 22 && minor >= 21));

  try {
    routes.fetch = nativeFetch ? 'node' : routeFetch();
    routes.http = nativeModules ? 'node' : routeModule(require('http'), httpProxy, false);
    routes.https = nativeModules ? 'node' : routeModule(require('https'), httpsProxy, true);
  } catch (error) {
    warn(`the Node preload failed, requests may bypass the proxy: ${error && error.message}`);
  }

  function routeFetch() {
    const path = require('path');
    const home = env.WIRETAPE_HOME || path.join(require('os').homedir(), '.wiretape');
    const modules = env.WIRETAPE_NODE_MODULES || path.join(home, 'node', 'node_modules');
    let undici;
    try {
      undici = require(path.join(modules, 'undici'));
    } catch (error) {
      const why =
        error && error.code === 'MODULE_NOT_FOUND'
          ? `no undici in ${modules}`
          : `cannot load undici from ${modules}: ${error && error.message}`;
      warn(`fetch() is not routed through the proxy: run \`${INSTALL}\` (${why})`);
      return null;
    }
    // Node's built-in fetch() reads the dispatcher that this sets (a global symbol).
    undici.setGlobalDispatcher(quietly('UNDICI-EHPA', () => new undici.EnvHttpProxyAgent()));
    let version = '';
    try {
      version = require(path.join(modules, 'undici', 'package.json')).version;
    } catch (error) {
      // an undici without its manifest still works
    }
    return `undici ${version}`.trim();
  }

  function routeModule(module, proxyUrl, secure) {
    if (!proxyUrl) return null;
    let proxy;
    try {
      proxy = new URL(proxyUrl);
    } catch (error) {
      warn(`ignoring the proxy ${proxyUrl}: not a URL`);
      return null;
    }
    if (proxy.protocol !== 'http:') {
      warn(`ignoring the proxy ${proxyUrl}: only http:// proxies are supported here`);
      return null;
    }
    const bypass = noProxyMatcher(env.no_proxy || env.NO_PROXY || '');
    const Base = module.Agent;

    class WiretapeTunnelAgent extends Base {
      createConnection(options, callback) {
        const host = options.host || 'localhost';
        const port = Number(options.port) || (secure ? 443 : 80);
        if (options.socketPath || bypass(host, port)) {
          return super.createConnection(options, callback);
        }
        openTunnel(proxy, host, port, (error, socket) => {
          if (error) {
            callback(error);
            return;
          }
          if (!secure) {
            callback(null, socket);
            return;
          }
          let tlsSocket;
          try {
            tlsSocket = super.createConnection({ ...options, socket });
          } catch (failure) {
            socket.destroy();
            callback(failure);
            return;
          }
          callback(null, tlsSocket);
        });
        return undefined;
      }
    }

    // The same options as the agent it replaces (keep-alive from Node 19 on).
    module.globalAgent = new WiretapeTunnelAgent({ ...module.globalAgent.options });
    return 'tunnel';
  }

  function openTunnel(proxy, host, port, callback) {
    const net = require('net');
    const authority = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
    const socket = net.connect({
      host: proxy.hostname.replace(/^\[|\]$/g, ''),
      port: Number(proxy.port) || 80,
    });
    let received = Buffer.alloc(0);
    let settled = false;

    function settle(error, result) {
      if (settled) return;
      settled = true;
      socket.removeListener('readable', onReadable);
      socket.removeListener('error', onError);
      socket.removeListener('end', onEnd);
      if (error) socket.destroy();
      callback(error, result);
    }
    function onError(error) {
      settle(new Error(`wiretape: cannot reach the proxy ${proxy.host}: ${error.message}`));
    }
    function onEnd() {
      settle(new Error(`wiretape: the proxy ${proxy.host} closed the CONNECT to ${authority}`));
    }
    function onReadable() {
      let chunk;
      while (!settled && (chunk = socket.read()) !== null) {
        received = Buffer.concat([received, chunk]);
        const end = received.indexOf('\r\n\r\n');
        if (end === -1) {
          if (received.length > 65536) settle(new Error('wiretape: oversized CONNECT answer'));
          continue;
        }
        const statusLine = received.toString('latin1', 0, received.indexOf('\r\n'));
        if (!/^HTTP\/1\.[01] 2\d\d/.test(statusLine)) {
          settle(new Error(`wiretape: the proxy refused CONNECT ${authority}: ${statusLine}`));
          return;
        }
        const rest = received.subarray(end + 4);
        if (rest.length) socket.unshift(rest);
        settle(null, socket);
      }
    }

    socket.on('readable', onReadable);
    socket.on('error', onError);
    socket.on('end', onEnd);
    socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
  }

  function noProxyMatcher(value) {
    const rules = value
      .split(/[\s,]+/)
      .filter(Boolean)
      .map((entry) => {
        if (entry === '*') return { any: true };
        let host = entry;
        let port = 0;
        const bracketed = /^\[(.*)\](?::(\d+))?$/.exec(entry);
        if (bracketed) {
          host = bracketed[1];
          port = Number(bracketed[2] || 0);
        } else if ((entry.match(/:/g) || []).length === 1) {
          [host, port] = [entry.split(':')[0], Number(entry.split(':')[1])];
        }
        return { host: host.replace(/^\*?\./, '').toLowerCase(), port };
      });
    return (hostname, port) => {
      const host = hostname.replace(/^\[|\]$/g, '').toLowerCase();
      return rules.some(
        (rule) =>
          rule.any ||
          ((!rule.port || rule.port === port) &&
            (host === rule.host || host.endsWith(`.${rule.host}`))),
      );
    };
  }

  // Runs `make` without the one warning `code` (the user did not ask for what warns).
  function quietly(code, make) {
    const emitWarning = process.emitWarning;
    process.emitWarning = function (warning, ...rest) {
      const options = rest[0];
      const given = options && typeof options === 'object' ? options.code : rest[1];
      if (given !== code) emitWarning.call(process, warning, ...rest);
    };
    try {
      return make();
    } finally {
      process.emitWarning = emitWarning;
    }
  }

  function warn(message) {
    process.stderr.write(`wiretape: ${message}\n`);
  }
})();
