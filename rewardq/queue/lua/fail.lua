-- fail: finish a trajectory with an error result for every key it answers for, dead-letter
-- the offending entry with its reason, and acknowledge.
-- KEYS: traj, stream, waiting, done, dead
-- ARGV: group, tid, reward_prefix, result_ttl, message, worker, index (-1: unknown),
--       entry_id ('' for none), done_maxlen, dead_maxlen, then dead-letter field/value pairs
-- Returns the number of keys given an error result (0 when it had already finished).
local traj, stream, waiting, done, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, tid, rprefix = ARGV[1], ARGV[2], ARGV[3]
local ttl, msg, worker = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local index, id, maxlen, dead_maxlen = tonumber(ARGV[7]), ARGV[8], ARGV[9], ARGV[10]
local now = now_seconds()

if #ARGV > 10 then
  local pairs_ = {}
  for j = 11, #ARGV do pairs_[#pairs_ + 1] = ARGV[j] end
  redis.call('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', unpack(pairs_))
end
local written = 0
if redis.call('HGET', traj, 'state') == 'done' then
  if index >= 0 then
    local rkey = rprefix .. tid .. '_' .. index
    if redis.call('EXISTS', rkey) == 0 then
      write_error(rkey, msg, worker, now, ttl)
      written = 1
    end
  end
else
  if id ~= '' then add_ack(traj, id) end
  written = finish_error(traj, stream, waiting, done, group, tid, rprefix, ttl, msg, worker,
                         index, maxlen, now)
end
if id ~= '' then ack_delete(stream, group, {id}) end
return written
