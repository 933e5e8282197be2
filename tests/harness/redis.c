/* Test harness, Redis part: a redis-server of the test's own on a loopback port, and an admin
 * connection to it. In cg_test_redis, for suites that link hiredis. */
#include "tests/harness/harness.h"

#include <stdio.h>
#include <sys/stat.h>
#include <hiredis/hiredis.h>

redisContext *th_redis_connect(int port)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && !c->err) redisSetTimeout(c, tv);
    return c;
}

int th_redis_up(int port)
{
    redisContext *c = th_redis_connect(port);
    int ok = 0;
    if (c && !c->err) {
        redisReply *r = redisCommand(c, "PING");
        ok = r && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
    }
    redisFree(c);
    return ok;
}

void th_redis_spawn(th_proc *p, const char *server, int port, const char *const *extra)
{
    char ports[16], dir[400], log[64];
    snprintf(ports, sizeof ports, "%d", port);
    snprintf(dir, sizeof dir, "%s/redis-%d", th_root(), port);
    snprintf(log, sizeof log, "redis-%d.log", port);
    mkdir(dir, 0755);
    const char *args[32] = {"--port", ports,    "--bind", "127.0.0.1",    "--dir",
                            dir,      "--save", "",       "--appendonly", "no"};
    int n = 10;
    for (int i = 0; extra && extra[i] && n < 31; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    ck_assert_int_eq(th_spawn(p, server, args, NULL, log, NULL, 0), 0);
    for (int i = 0; i < 200 && !th_redis_up(port); i++)
        th_sleep_ms(25);
    ck_assert_msg(th_redis_up(port), "redis-server on %d did not start", port);
    p->port = port;
}

long long th_redis_int(int port, const char *cmd)
{
    redisContext *c = th_redis_connect(port);
    ck_assert(c && !c->err);
    redisReply *r = redisCommand(c, cmd);
    ck_assert(r && r->type == REDIS_REPLY_INTEGER);
    long long v = r->integer;
    freeReplyObject(r);
    redisFree(c);
    return v;
}
