-- commit: write every key's result, then acknowledge. The ack is taken only here, after
-- the write-back, in the same atomic step. A repeated commit (after a crash) changes nothing.
-- KEYS: traj, stream, waiting, done, records
-- ARGV: group, tid, worker, result_ttl, done_maxlen, n, nfields, field names..., rows, then
--       rows * nfields values: rows = 1 gives every key the same values (a manager's one result
--       copied to every key), rows = n gives key 0's values, key 1's values, ...; then
--       reward_prefix, status, keep_records (seconds to keep the stored outputs in `records`
--       for inspection; 0: drop), max_outputs
-- Returns 1 when this call finished the trajectory, 0 when it was already finished.
-- Budget: n <= max_outputs keys written (refused otherwise), one HMGET/HDEL of n fields in
-- chunks, and the acknowledgement of at most max_outputs + 16 recorded entries.
local traj, stream, waiting, done, records = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, tid, worker = ARGV[1], ARGV[2], ARGV[3]
local ttl, maxlen, n, nf = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local names = {}
for j = 1, nf do names[j] = ARGV[7 + j] end
local rows = tonumber(ARGV[8 + nf])
local base = 8 + nf
local rprefix, status = ARGV[base + rows * nf + 1], ARGV[base + rows * nf + 2]
local keep = tonumber(ARGV[base + rows * nf + 3] or '0')
local max_out = tonumber(ARGV[base + rows * nf + 4])
if not max_out or n < 1 or n > max_out or (rows ~= 1 and rows ~= n) then
  return redis.error_reply('commit of ' .. tid .. ': ' .. n .. ' outputs is not in 1..max_outputs=' ..
                           tostring(max_out) .. ' (or rows ' .. rows .. ' is neither 1 nor n)')
end
local now = now_seconds()

if redis.call('HGET', traj, 'state') == 'done' then
  ack_delete(stream, group, recorded_acks(traj))
  return 0
end
local function row_args(row)
  local args = {}
  for j = 1, nf do
    args[#args + 1] = names[j]
    args[#args + 1] = ARGV[base + row * nf + j]
  end
  return args
end
local shared = rows == 1 and row_args(0) or nil
for i = 0, n - 1 do
  local rkey = rprefix .. tid .. '_' .. i
  local args = shared or row_args(i)
  redis.call('DEL', rkey)
  redis.call('HSET', rkey, unpack(args))
  if ttl > 0 then redis.call('EXPIRE', rkey, ttl) end
end
local fields = {}
for i = 0, n - 1 do fields[#fields + 1] = 'o:' .. i end
if keep > 0 then
  materialize(traj, stream)
  local payloads = hmget_all(traj, fields)
  local pairs_ = {}
  for i = 1, #fields do
    if payloads[i] then
      pairs_[#pairs_ + 1] = fields[i]
      pairs_[#pairs_ + 1] = payloads[i]
    end
  end
  if #pairs_ > 0 then
    redis.call('DEL', records)
    each_chunk(#pairs_, function(a, b) redis.call('HSET', records, unpack(pairs_, a, b)) end)
    redis.call('EXPIRE', records, math.ceil(keep))
  end
end
each_chunk(#fields, function(a, b) redis.call('HDEL', traj, unpack(fields, a, b)) end)
redis.call('HDEL', traj, 'lease', 'lease_until', 'whole')
redis.call('HSET', traj, 'state', 'done', 'status', status, 'worker', worker,
           'done_at', string.format('%.6f', now), 'n', n)
if ttl > 0 then redis.call('EXPIRE', traj, ttl) end
redis.call('ZREM', waiting, tid)
ack_delete(stream, group, recorded_acks(traj))
local latency = ''
for j = 1, nf do
  if names[j] == 'latency_ms' then latency = ARGV[base + (rows - 1) * nf + j] end
end
redis.call('XADD', done, 'MAXLEN', '~', maxlen, '*', 'tid', tid, 'n', n, 'status', status,
           'worker', worker, 'latency_ms', latency)
return 1
