-- claim: the fast path for a trajectory whose outputs 0..final all came in one read batch
-- of this worker (the usual case: `put_trajectory` sends them in one MULTI/EXEC).
-- One call instead of one `store` per output: the records stay where they are (in the
-- stream, pending for this worker) instead of being copied into the trajectory hash, and
-- the worker keeps the copies it read. A crash is recovered like any other: the pending
-- entries are reclaimed and `store` finds the `whole` trajectory and completes it again.
-- KEYS: traj   ARGV: worker, lease_seconds, id_0, ..., id_final
-- Returns {'complete'} (this worker holds the lease), or {'slow'}: the trajectory is already
-- known (redelivery, duplicate, earlier outputs): file the records one by one with `store`.
local traj, worker, lease = KEYS[1], ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', traj) == 1 then return {'slow'} end
local now = now_seconds()
local ids = {}
for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
local list = table.concat(ids, ',')
redis.call('HSET', traj, 'state', 'collecting', 'whole', list, 'acks', list, 'final', #ids - 1,
           'stored', #ids, 'first_seen', string.format('%.6f', now), 'last_seen', string.format('%.6f', now),
           'lease', worker, 'lease_until', string.format('%.6f', now + lease), 'attempts', 1)
return {'complete'}
