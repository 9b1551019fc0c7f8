-- fail: finish a trajectory with an error result for every key it answers for, dead-letter
-- the offending entry with its reason, and acknowledge. A key that already has a result
-- (another or a finished trajectory's) keeps it.
-- KEYS: traj, stream, waiting, done, dead, records
-- ARGV: group, tid, reward_prefix, result_ttl, message, worker, index (decimal digits, or -1:
--       unknown), entry_id ('' for none), done_maxlen, dead_maxlen, max_outputs, keep_records,
--       failure_kind (a FailureKind value), extra_info (the error's reward_extra_info as JSON, ''
--       for {"error": message}), provenance (the digest of what failed, or ''), attempt (the
--       caller's attempt, or ''), dead_bytes, dead_ttl_ms (the dead-letter stream's bounds, see
--       add_dead), nacks, then nacks more entry ids to acknowledge with it (the other entries of
--       the trajectory the worker holds), then dead-letter field/value pairs
-- Returns {attempt, final, index, ...}: the attempt the error results say (the caller's, or the
-- scoring attempts the trajectory's hash counted when more, for a key of the trajectory: read
-- here, atomically, so a worker's ledger rows for these keys outrank the rows of an attempt that
-- died scoring it; '' for none),
-- the trajectory's final index as its hash knew it ('' when not known), then the indexes of the
-- keys given an error result, as text (at most max_outputs + 1). Their latency_ms is from the
-- put of entry_id (its `ts` field) to now ('' without an entry).
-- Budget: at most max_outputs + 1 keys written (an index at or past max_outputs names its one
-- key only) of a message the worker cut to ~1 KB and extra info it bounded to a few KB, one dead
-- letter (its fields cut by the worker; the stream then trimmed by add_dead),
-- the stored records ended (`end_records`), one XRANGE of one entry (its put time), the
-- acknowledgement of at most max_outputs + 16 recorded entries plus the nacks <= max_outputs given.
local traj, stream, waiting, done, dead, records = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local group, tid, rprefix = ARGV[1], ARGV[2], ARGV[3]
local ttl, msg, worker = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local index_text, id, maxlen, dead_maxlen = ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local max_out, keep = tonumber(ARGV[11]), tonumber(ARGV[12])
local refused = refused_rights(stream, group, traj)
if refused then return refused end
local dead_bytes, dead_ttl = tonumber(ARGV[17]), tonumber(ARGV[18])
local nacks = tonumber(ARGV[19])
local index = tonumber(index_text) or -1
local now = now_seconds()
local counted = redis.call('HMGET', traj, 'attempts', 'final', 'state')
local finished = counted[3] == 'done'
-- the attempts its hash counted: those of a key of the trajectory (a key past a finished one's final
-- output was in none of them)
local hashed = tonumber(counted[1] or '0') or 0
if finished and not (index >= 0 and index <= (tonumber(counted[2] or '') or -1)) then hashed = 0 end
local attempt = math.max(tonumber(ARGV[16]) or 0, hashed)
local attempt_text = attempt > 0 and string.format('%d', attempt) or ''
-- latency_ms: from the put of the entry that failed it (its `ts`) to now, as a commit's
local err = error_result(msg, ARGV[13], ARGV[14], ARGV[15], attempt_text, latency_text(entry_ts(stream, id), now))
if nacks < 0 or nacks > max_out then
  return redis.error_reply('fail of ' .. tid .. ': ' .. nacks .. ' entries to acknowledge is not in 0..max_outputs')
end
local ids = {}
if id ~= '' then ids[1] = id end
for j = 20, 19 + nacks do ids[#ids + 1] = ARGV[j] end

if #ARGV > 19 + nacks then
  local pairs_ = {}
  for j = 20 + nacks, #ARGV do pairs_[#pairs_ + 1] = ARGV[j] end
  add_dead(dead, pairs_, tonumber(dead_maxlen), dead_bytes, dead_ttl)
end
local wrote = {}
if finished then
  if index >= 0 and string.match(index_text, '^%d+$') and
     write_error(rprefix .. tid .. '_' .. index_text, err, worker, now, ttl) == 1 then
    wrote[1] = index_text
  end
else
  for _, eid in ipairs(ids) do add_ack(traj, eid, max_out) end
  wrote = finish_error(traj, stream, waiting, done, records, group, tid, rprefix, ttl, err, worker,
                       index, index_text, maxlen, now, max_out, keep)
end
ack_delete(stream, group, ids)
local out = {attempt_text, counted[2] or ''}
for _, i in ipairs(wrote) do out[#out + 1] = i end
return out
