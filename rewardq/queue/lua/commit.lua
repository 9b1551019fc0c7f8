-- commit: write every key's result, then acknowledge. The ack is taken only here, after the
-- write-back, in the same atomic step. A repeated commit (after a crash) changes nothing.
-- KEYS: traj, stream, waiting, done, records
-- ARGV: group, tid, worker, result_ttl, done_maxlen, n, first, last, staged_prefix, stage_ttl,
--       reward_prefix, status, keep_records, max_outputs, max_bytes, nfields, field names...,
--       rows, then rows * nfields values
--   This call writes the results of keys first..last: rows = 1 gives each of them the same values
--   (a manager's one result copied to every key), rows = last - first + 1 gives each its own.
--   keep_records: seconds to keep the stored outputs in `records` for inspection (0: delete them).
-- One call commits a trajectory whose results take at most max_bytes (first = 0, last = n - 1).
-- A larger one is committed in several calls, none writing more than max_bytes: `stage` calls
-- (last < n - 1) write their keys' results under staged_prefix .. i, keys nobody reads that expire
-- after stage_ttl; the final call (last = n - 1) checks that keys 0..first-1 are all staged,
-- RENAMEs them into place (O(1) each: no byte is copied), writes its own keys, acknowledges and
-- publishes to `done`, in one atomic step. So no result is visible before its trajectory is
-- acknowledged, however large the trajectory; a worker dying between the calls leaves only staged
-- keys, which expire, and the entries pending, to be reclaimed and scored again.
-- Returns 1 when this call finished the trajectory (a stage call: when it staged), 0 when the
-- trajectory was already finished (nothing written; the final call then only re-acknowledges and
-- deletes the staged keys).
-- Budget: last - first + 1 <= max_outputs keys written, of at most max_bytes bytes in all (refused
-- otherwise; counted here from the arguments), and their copy in `traj` (one row, or 64 KiB at most)
-- and in the `done` entry (one row of at most 1 KiB), and for the final call first <= max_outputs - 1
-- staged keys renamed, the stored records ended (`end_records`) and at most max_outputs + 16
-- entries acknowledged.
local traj, stream, waiting, done, records = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, tid, worker = ARGV[1], ARGV[2], ARGV[3]
local ttl, maxlen, n = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local first, last, staged, stage_ttl = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local rprefix, status, keep = ARGV[11], ARGV[12], tonumber(ARGV[13])
local max_out, max_bytes, nf = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
local names = {}
for j = 1, nf do names[j] = ARGV[16 + j] end
local rows = tonumber(ARGV[17 + nf])
local base = 17 + nf
local count = (last or -1) - (first or 0) + 1
if not max_out or n < 1 or n > max_out or first < 0 or count < 1 or last > n - 1 or
   (rows ~= 1 and rows ~= count) or #ARGV ~= base + rows * nf then
  return redis.error_reply('commit of ' .. tid .. ': keys ' .. tostring(first) .. '..' .. tostring(last) ..
                           ' of ' .. tostring(n) .. ' outputs are not in 0..max_outputs-1 (max_outputs=' ..
                           tostring(max_out) .. '), or rows ' .. tostring(rows) .. ' is neither 1 nor their count')
end
local bytes = 0
for j = base + 1, base + rows * nf do bytes = bytes + #ARGV[j] end
if rows == 1 then bytes = bytes * count end
if bytes > max_bytes then
  return redis.error_reply('commit of ' .. tid .. ': this call would write ' .. bytes .. ' bytes, over its ' ..
                           max_bytes .. '-byte budget')
end
local final = last == n - 1
-- Whether `check` (redis.acl_check_cmd) lets this user COPY keys[1] to each other key and read
-- keys[1]'s encoding. Work: one check per key (at most max_outputs).
local function copy_permitted(keys, check)
  local ok, allowed = pcall(check, 'OBJECT', 'ENCODING', keys[1])
  if not (ok and allowed) then return false end
  for j = 2, #keys do
    ok, allowed = pcall(check, 'COPY', keys[1], keys[j], 'REPLACE')
    if not (ok and allowed) then return false end
  end
  return true
end
local function stage_key(i) return staged .. i end
local refused = refused_rights(stream, group, traj)
if refused then return refused end

if redis.call('HGET', traj, 'state') == 'done' then
  if final then
    for i = 0, first - 1 do redis.call('DEL', stage_key(i)) end
    ack_recorded(traj, stream, group)
  end
  return 0
end
if final then
  for i = 0, first - 1 do
    if redis.call('EXISTS', stage_key(i)) == 0 then
      return redis.error_reply('commit of ' .. tid .. ': the staged result of key ' .. i ..
                               ' is gone (expired after ' .. stage_ttl .. 's?); the trajectory stays pending')
    end
  end
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
local rkeys = {}
for i = first, last do rkeys[#rkeys + 1] = final and (rprefix .. tid .. '_' .. i) or stage_key(i) end
-- One row for every key: key 0's hash is written as below, then COPYed to the others (the hash and
-- its TTL in one command, no field parsed again: ~5x cheaper per key) when it is a listpack (copied
-- byte for byte, so HGETALL lists the same fields in the same order as an HSET would; a hashtable's
-- copy may list them in another order) and this user may run COPY and OBJECT (asked first, before
-- any write; Redis 7's redis.acl_check_cmd). Otherwise (no right, an older Redis or the embedded
-- stand-in without acl_check_cmd) every key is written as key 0 is: the same hashes and TTLs.
-- Work: at most max_outputs checks.
local copy_ok = shared ~= nil and #rkeys > 1 and redis.acl_check_cmd ~= nil and
                copy_permitted(rkeys, redis.acl_check_cmd)
-- every key's old hash goes first, in one DEL per CHUNK keys: the keys are distinct, so this is the
-- DEL before each key's HSET, in fewer calls
each_chunk(#rkeys, function(a, b) redis.call('DEL', unpack(rkeys, a, b)) end)
local template
for i = first, last do
  local rkey = rkeys[i - first + 1]
  if template then
    redis.call('COPY', template, rkey, 'REPLACE')
  else
    redis.call('HSET', rkey, unpack(shared or row_args(i - first)))
    if not final then
      redis.call('EXPIRE', rkey, stage_ttl)
    elseif ttl > 0 then
      redis.call('EXPIRE', rkey, ttl)
    end
    if copy_ok and redis.call('OBJECT', 'ENCODING', rkey) == 'listpack' then template = rkey end
  end
end
if not final then return 1 end
for i = 0, first - 1 do
  local rkey = rprefix .. tid .. '_' .. i
  redis.call('RENAME', stage_key(i), rkey)
  if ttl > 0 then redis.call('EXPIRE', rkey, ttl) else redis.call('PERSIST', rkey) end
end
end_records(traj, stream, records, keep, max_out)
redis.call('HDEL', traj, 'lease', 'lease_until', 'lease_life')
local ended = {'state', 'done', 'status', status, 'worker', worker,
               'done_at', string.format('%.6f', now_seconds()), 'n', n}
-- The trajectory's results in one place too, when this call holds them all and they are small
-- (one shared row, or at most 64 KiB): `result_rows` rows of `result:<row>:<field>`, row 0 for
-- every key when rows = 1, else row i for key i. A producer reads them with one HGETALL of the
-- trajectory instead of one per key; the per-key hashes stay the results' home. They go in the
-- same HSET as the state (one per CHUNK values: CHUNK is even, so each holds whole pairs).
if first == 0 and (rows == 1 or bytes <= 65536) then
  ended[#ended + 1] = 'result_rows'
  ended[#ended + 1] = rows
  for r = 0, rows - 1 do
    for j = 1, nf do
      ended[#ended + 1] = 'result:' .. r .. ':' .. names[j]
      ended[#ended + 1] = ARGV[base + r * nf + j]
    end
  end
end
each_chunk(#ended, function(a, b) redis.call('HSET', traj, unpack(ended, a, b)) end)
if ttl > 0 then redis.call('EXPIRE', traj, ttl) end
redis.call('ZREM', waiting, tid)
ack_recorded(traj, stream, group)
local latency = ''
for j = 1, nf do
  if names[j] == 'latency_ms' then latency = ARGV[base + (rows - 1) * nf + j] end
end
local announce = {'tid', tid, 'n', n, 'status', status, 'worker', worker, 'latency_ms', latency}
-- A result shared by every key, when small (at most 1 KiB of values), rides on the announcement
-- too, as the trajectory's copy spells it: a producer waiting for it needs no read at all.
if first == 0 and rows == 1 and bytes <= 1024 * count then
  announce[#announce + 1] = 'result_rows'
  announce[#announce + 1] = 1
  for j = 1, nf do
    announce[#announce + 1] = 'result:0:' .. names[j]
    announce[#announce + 1] = ARGV[base + j]
  end
end
redis.call('XADD', done, 'MAXLEN', '~', maxlen, '*', unpack(announce))
return 1
