-- fail: finish a trajectory with an error result for every key it answers for, dead-letter
-- the offending entry with its reason, and acknowledge. A key that already has a result
-- (another or a finished trajectory's) keeps it.
-- KEYS: traj, stream, waiting, done, dead
-- ARGV: group, tid, reward_prefix, result_ttl, message, worker, index (decimal digits, or -1:
--       unknown), entry_id ('' for none), done_maxlen, dead_maxlen, max_outputs, then dead-letter
--       field/value pairs
-- Returns the number of keys given an error result.
-- Budget: at most max_outputs + 1 keys written (an index at or past max_outputs names its one
-- key only), one dead letter, the acknowledgement of at most max_outputs + 16 entries.
local traj, stream, waiting, done, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, tid, rprefix = ARGV[1], ARGV[2], ARGV[3]
local ttl, msg, worker = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local index_text, id, maxlen, dead_maxlen = ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local max_out = tonumber(ARGV[11])
local index = tonumber(index_text) or -1
local now = now_seconds()

if #ARGV > 11 then
  local pairs_ = {}
  for j = 12, #ARGV do pairs_[#pairs_ + 1] = ARGV[j] end
  redis.call('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', unpack(pairs_))
end
local written = 0
if redis.call('HGET', traj, 'state') == 'done' then
  if index >= 0 and string.match(index_text, '^%d+$') then
    written = write_error(rprefix .. tid .. '_' .. index_text, msg, worker, now, ttl)
  end
else
  if id ~= '' then add_ack(traj, id, max_out) end
  written = finish_error(traj, stream, waiting, done, group, tid, rprefix, ttl, msg, worker,
                         index, index_text, maxlen, now, max_out)
end
if id ~= '' then ack_delete(stream, group, {id}) end
return written
