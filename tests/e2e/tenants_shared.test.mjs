// tenants_shared.test.mjs — what a server with tenants shares with others
// and between its tenants (issue 28, the rest of "many users, one server"):
// the default shm directory said at start when keys or a cache secret are
// in force (every server of the Unix user shares it).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, writeStoreConfig } from './lib.mjs';

const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-tenants-shared-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const SHARED = /W serve\s+store: the default shm tier \S+ is shared with every kvstash process of uid \d+ on this host/;

test('the default shm directory: a warning at start with keys or a cache secret, none with a directory of its own', async () => {
  const secret = path.join(dir, 'secret');
  writeFileSync(secret, 'a-cache-secret-of-32-bytes-or-so\n', { mode: 0o600 });
  const own = await writeStoreConfig(path.join(dir, 'own.yaml'), { cacheDir: path.join(dir, 'disk-own'), shmDir: path.join(dir, 'shm-own') });
  const cases = [
    // [flags, warned, what the warning says]
    [['--cache-dir', path.join(dir, 'disk1'), '--api-key', 'KA', '--api-key', 'KB'], true, /tenants/],
    [['--cache-dir', path.join(dir, 'disk2'), '--api-key', 'KA'], true, /tenants/],
    [['--cache-dir', path.join(dir, 'disk3'), '--cache-secret-file', secret], true, /without this cache secret .* refused here/],
    [['--cache-dir', path.join(dir, 'disk4')], false],
    [['--config', own, '--api-key', 'KA', '--api-key', 'KB', '--cache-secret-file', secret], false],
  ];
  for (const [flags, warned, says] of cases) {
    const srv = await startServer(flags);
    try {
      const err = srv.stderr;
      assert.match(err, /store: shm tier \S+ .*is shared with every kvstash process of uid/, 'the info line, always');
      if (warned) {
        assert.match(err, SHARED, `${flags.join(' ')}: ${err}`);
        assert.match(err.split('\n').filter((l) => SHARED.test(l)).join('\n'), says);
        assert.match(err, /give store\.shm_dir a directory of this server's own/);
      } else {
        assert.doesNotMatch(err, SHARED, flags.join(' '));
      }
    } finally {
      await stopOk(srv);
    }
  }
});
