// openapi/gateway.yaml and openapi/worker.yaml lint clean (no error, no warning) with
// @redocly/cli's recommended rules, as configured in redocly.yaml. Run through npx with
// --no-install: only the version pinned in package.json is used, never a download.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));

// Resolves with {status, stdout, stderr, error} of one `redocly lint` run.
const lint = (api) => new Promise((resolve) => {
  const child = execFile('npx', ['--no-install', '@redocly/cli', 'lint', api, '--format=json'], {
    cwd: HERE,
    // No telemetry and no update check: the tests run offline.
    env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' },
    timeout: 60000,
  }, (error, stdout, stderr) => resolve({ status: child.exitCode, stdout, stderr, error }));
});

describe('openapi lint', { concurrency: true }, () => {
  for (const api of ['gateway', 'worker']) test(`redocly lint: openapi/${api}.yaml`, async () => {
    const r = await lint(api);
    assert.ok(!r.error || r.status !== null, `npx could not run: ${r.error}`);
    let report;
    try {
      report = JSON.parse(r.stdout);
    } catch {
      assert.fail(`redocly printed no JSON report (exit ${r.status}):\n${r.stdout}\n${r.stderr}`);
    }
    const problems = report.problems.map((p) =>
      `${p.severity} ${p.ruleId}: ${p.message} at ${p.location?.[0]?.pointer ?? '?'}`);
    assert.deepEqual(problems, [], `openapi/${api}.yaml has lint problems`);
    assert.deepEqual(report.totals, { errors: 0, warnings: 0, ignored: 0 });
    assert.equal(r.status, 0, r.stderr);
  });
});
