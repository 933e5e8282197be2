// Starts a real chunkgate-worker and a real chunkgate in front of it on ephemeral loopback
// ports (a temporary data dir, a freshly generated tiny model) for the compat tests.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const MODEL = 'chunkgate-tiny';
export const ADMIN_TOKEN = 'compat-admin-token';

const children = new Set();
// A crashed test must not leave servers behind on the machine.
process.on('exit', () => {
  for (const c of children) c.kill('SIGKILL');
});

function binary(envName) {
  const bin = process.env[envName];
  if (!bin) throw new Error(`${envName} is not set: ctest passes the built binary's path`);
  if (!fs.existsSync(bin)) throw new Error(`${envName}=${bin} does not exist: build it first`);
  return bin;
}

// Spawns bin with args; resolves with {child, port, log} once its stderr says
// "listening on HOST:PORT" (the JSON log line both programs write when bound).
function startProcess(name, bin, args, dir) {
  const logPath = path.join(dir, `${name}.log`);
  const log = fs.openSync(logPath, 'w');
  const child = spawn(bin, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    // libgomp's default spin-wait starves OpenBLAS threads on small machines.
    env: { ...process.env, OMP_WAIT_POLICY: 'passive' },
  });
  children.add(child);
  let text = '';
  // 'close' (not 'exit'): the pipes are drained, so the log file is complete.
  const exited = new Promise((resolve) => child.on('close', (code, sig) => {
    children.delete(child);
    fs.closeSync(log);
    resolve(code ?? sig);
  }));
  let bound = false;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${name} did not report its port within 30 s:\n${text}`));
    }, 30000);
    const onData = (buf) => {
      fs.writeSync(log, buf);
      if (bound) return;
      text += buf.toString();
      const m = /"msg":"listening on ([0-9.]+):(\d+)"/.exec(text);
      if (m) {
        bound = true;
        clearTimeout(timer);
        resolve({ name, child, port: Number(m[2]), logPath, exited, logs: () => fs.readFileSync(logPath, 'utf8') });
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    exited.then((code) => {
      if (bound) return;
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code}) before listening:\n${text}`));
    });
  });
}

// SIGTERM, then SIGKILL after 10 s; resolves with the exit status (or the signal's name).
async function stopProcess(p) {
  if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill('SIGTERM');
  const t = setTimeout(() => p.child.kill('SIGKILL'), 10000);
  const code = await p.exited;
  clearTimeout(t);
  return code;
}

/**
 * Generates the tiny model and starts one worker plus the gateway (`--worker`, no
 * `--backend`: the worker answers completions, the main path).
 * @param {object} [opts] gatewayArgs / workerArgs: extra flags.
 * @returns {Promise<{gatewayUrl, workerUrl, dir, stop, logs}>} call stop() when done: it
 * stops both processes, removes the temporary directory and resolves with
 * {gateway, worker} exit statuses.
 */
export async function startStack(opts = {}) {
  const gwBin = binary('CHUNKGATE_BIN');
  const wkBin = binary('CHUNKGATE_WORKER_BIN');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'chunkgate-compat-'));
  const model = path.join(dir, 'model');
  execFileSync(wkBin, ['generate-model', '--out', model], { stdio: 'pipe' });
  const procs = [];
  // Stops the gateway, then the worker; resolves with their exit statuses by name.
  const stop = async () => {
    const codes = {};
    for (const p of [...procs].reverse()) codes[p.name] = await stopProcess(p);
    fs.rmSync(dir, { recursive: true, force: true });
    return codes;
  };
  try {
    const worker = await startProcess('worker', wkBin, [
      'serve', '--model', model, '--listen', '127.0.0.1:0', '--data-dir', path.join(dir, 'worker'),
      '--pool-mb', '32', ...(opts.workerArgs || []),
    ], dir);
    procs.push(worker);
    const workerUrl = `http://127.0.0.1:${worker.port}`;
    const gateway = await startProcess('gateway', gwBin, [
      '--listen', '127.0.0.1:0', '--worker', workerUrl, '--data-dir', path.join(dir, 'gateway'),
      '--admin-token', ADMIN_TOKEN, ...(opts.gatewayArgs || []),
    ], dir);
    procs.push(gateway);
    return {
      gatewayUrl: `http://127.0.0.1:${gateway.port}`,
      workerUrl,
      dir,
      stop,
      logs: () => procs.map((p) => `--- ${p.name}\n${p.logs()}`).join('\n'),
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Parses a text/event-stream body into its data payloads (comments dropped). */
export function sseData(text) {
  const out = [];
  for (const event of text.split(/\r?\n\r?\n/)) {
    const data = event.split(/\r?\n/).filter((l) => l.startsWith('data:'))
      .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
    if (data) out.push(data);
  }
  return out;
}
