-- expire: end trajectories that waited too long for outputs, naming what is missing.
-- KEYS: waiting, stream, done, dead
-- ARGV: group, traj_prefix, reward_prefix, result_ttl, worker, limit, timeout_seconds,
--       done_maxlen, dead_maxlen, max_outputs, records_prefix, keep_records
-- Returns {tid, reason, tid, reason, ...} for the trajectories it ended.
-- Budget: at most `limit` trajectories, and it stops taking more once max_outputs keys were
-- written in this call: at most 2 * max_outputs keys written (the rest wait for the next pass), each
-- with a reason of at most ~400 bytes (missing_text counts what it does not spell out); each
-- trajectory's stored records ended (`end_records`).
local waiting, stream, done, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, tprefix, rprefix = ARGV[1], ARGV[2], ARGV[3]
local ttl, worker, limit, timeout = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), ARGV[7]
local maxlen, dead_maxlen, max_out = ARGV[8], ARGV[9], tonumber(ARGV[10])
local rec_prefix, keep = ARGV[11], tonumber(ARGV[12])
local now = now_seconds()
local out = {}
local written = 0
local due = redis.call('ZRANGEBYSCORE', waiting, '-inf', now, 'LIMIT', 0, limit)
for _, tid in ipairs(due) do
  if written >= max_out then break end
  local traj = tprefix .. tid
  local state = redis.call('HGET', traj, 'state')
  if state == 'collecting' then
    local reason = 'incomplete trajectory: ' .. missing_text(traj, max_out) .. ' after waiting ' .. timeout .. 's'
    written = written + 1 + finish_error(traj, stream, waiting, done, rec_prefix .. tid, group, tid, rprefix, ttl,
                                         error_result(reason, 'input', ''), worker, -1, '', maxlen, now,
                                         max_out, keep)
    redis.call('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', 'tid', tid, 'reason', reason,
               'kind', 'incomplete', 'failure_kind', 'input', 'worker', worker,
               'time', string.format('%.6f', now))
    out[#out + 1] = tid
    out[#out + 1] = reason
  else
    redis.call('ZREM', waiting, tid)
  end
end
return out
