-- cancel: the producer no longer needs a trajectory. Unless it has finished already, every key it
-- answers for gets a `cancelled` result, its trajectory ends (`state` done, `status` cancelled),
-- its recorded entries are acknowledged and `done` says so. A worker scoring it finds out through
-- `<ns>:cancels` (rewardq/consumers/cancels.py) and stops; its commit then finds the trajectory
-- done and writes nothing. A record of it that arrives or is reclaimed later is acknowledged by
-- `store` without being scored.
-- KEYS: traj, stream, waiting, done, records
-- ARGV: group, tid, reward_prefix, result_ttl, done_maxlen, max_outputs, keep_records, nidx,
--       then nidx output indices the caller named (a trajectory not seen yet is known only by them)
-- Returns the number of keys given a `cancelled` result (0: the trajectory had finished; its
-- results stand).
-- Budget: at most max_outputs keys written (indices past max_outputs - 1 are ignored; nidx is
-- refused past max_outputs), the stored records ended (`end_records`), the acknowledgement of at
-- most max_outputs + 16 recorded entries.
local traj, stream, waiting, done, records = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, tid, rprefix = ARGV[1], ARGV[2], ARGV[3]
local ttl, maxlen, max_out, keep = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local nidx = tonumber(ARGV[8])
if not nidx or nidx < 0 or nidx > max_out or #ARGV ~= 8 + nidx then
  return redis.error_reply('cancel of ' .. tid .. ': ' .. tostring(ARGV[8]) ..
                           ' indices is not in 0..max_outputs (max_outputs=' .. max_out .. ')')
end
if redis.call('HGET', traj, 'state') == 'done' then return 0 end
local known = redis.call('EXISTS', traj) == 1
local hi = -1
if known then hi = math.min(highest_index(traj, max_out), max_out - 1) end
for j = 9, 8 + nidx do
  local i = tonumber(ARGV[j])
  if i and i >= 0 and i < max_out and i > hi then hi = i end
end
local now = string.format('%.6f', now_seconds())
local written = 0
for i = 0, hi do
  local rkey = rprefix .. tid .. '_' .. i
  if redis.call('EXISTS', rkey) == 0 then
    redis.call('HSET', rkey, 'status', 'cancelled', 'reward_score', '', 'reward_extra_info', '{}',
               'error', '', 'worker', '', 'manager', '', 'scored_at', now, 'latency_ms', '',
               'provenance', '', 'attempt', '', 'judge_request', '')
    if ttl > 0 then redis.call('EXPIRE', rkey, ttl) end
    written = written + 1
  end
end
if known then end_records(traj, stream, records, keep, max_out) end
redis.call('HDEL', traj, 'lease', 'lease_until', 'lease_life')
redis.call('HSET', traj, 'state', 'done', 'status', 'cancelled', 'done_at', now, 'n', hi + 1)
if ttl > 0 then redis.call('EXPIRE', traj, ttl) end
redis.call('ZREM', waiting, tid)
ack_recorded(traj, stream, group)
redis.call('XADD', done, 'MAXLEN', '~', maxlen, '*', 'tid', tid, 'n', hi + 1, 'status', 'cancelled')
return written
