-- claim: the fast path for a trajectory whose outputs 0..final all came in one read batch
-- of this worker (the usual case: `put_trajectory` sends them in one MULTI/EXEC).
-- One call instead of one `store` per output: the records stay where they are (in the
-- stream, pending for this worker) instead of being copied into the trajectory hash, and
-- the worker keeps the copies it read. A crash is recovered like any other: the pending
-- entries are reclaimed and `store` finds the `whole` trajectory and completes it again.
-- KEYS: traj   ARGV: worker, life, lease_seconds, max_outputs, n, id_0 .. id_n-1, digest_0 .. digest_n-1
--   life: the worker's process life (take_lease in common.lua)
-- Returns {'complete'} (this worker holds the lease), or {'slow'}: the trajectory is already
-- known (redelivery, duplicate, earlier outputs), or has more than max_outputs outputs: file
-- the records one by one with `store`.
-- Budget: O(n) with n <= max_outputs (one HSET of the state and n digests, in chunks).
local traj, worker, life, lease = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local max_out, n = tonumber(ARGV[4]), tonumber(ARGV[5])
if n < 1 or n > max_out or #ARGV ~= 5 + 2 * n then return {'slow'} end
if redis.call('EXISTS', traj) == 1 then return {'slow'} end
local now = now_seconds()
local ids = {}
for i = 1, n do ids[i] = ARGV[5 + i] end
local list = table.concat(ids, ',')
local fields = {'state', 'collecting', 'whole', list, 'acks', list, 'final', n - 1, 'hi', n - 1,
                'stored', n, 'first_seen', string.format('%.6f', now), 'last_seen', string.format('%.6f', now),
                'lease', worker, 'lease_life', life, 'lease_until', string.format('%.6f', now + lease),
                'attempts', 1}
for i = 1, n do
  fields[#fields + 1] = 'h:' .. (i - 1)
  fields[#fields + 1] = ARGV[5 + n + i]
end
each_chunk(#fields, function(a, b)  -- CHUNK is even: each slice holds whole field/value pairs
  redis.call('HSET', traj, unpack(fields, a, b))
end)
return {'complete'}
