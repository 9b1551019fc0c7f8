-- Shared helpers, prepended to every rewardq script (see rewardq/queue/scripts.py).
-- Every key a script touches carries the shard's hash tag, so one script = one slot.
--
-- Bounds. No loop here runs over a count a record controls without `max_out` (the worker's
-- max_outputs, passed by the worker, never taken from a record): a trajectory's indices are
-- 0 .. max_out - 1, its hash holds at most max_out records and digests, and its `acks` list at
-- most max_out + ACK_SLACK entry ids. Variadic calls go in chunks of CHUNK values (Lua's
-- unpack() stops at ~8000).

local CHUNK = 1000
local ACK_SLACK = 16
-- Bytes of a `whole` trajectory's records (still in the stream) copied into its `records` hash when
-- records are kept; the rest are not kept. Records in the trajectory hash are kept by one RENAME.
local KEEP_COPY_BYTES = 8 * 1024 * 1024
-- Longest list of missing indices an error reason spells out (the rest are counted).
local MISSING_TEXT_CHARS = 300

local function now_seconds()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- Call fn(first, last) for consecutive slices of 1..n, CHUNK at a time.
local function each_chunk(n, fn)
  for a = 1, n, CHUNK do fn(a, math.min(n, a + CHUNK - 1)) end
end

-- XCLAIM entries `ids` of `stream` for `worker` without counting a delivery (JUSTID), `idle_ms`
-- idle (0: just now), CHUNK ids per call. (The ids go last of the arguments built here: Lua passes
-- only the first value of an `unpack` followed by more arguments.)
local function touch_entries(stream, group, worker, ids, idle_ms)
  each_chunk(#ids, function(a, b)
    local args = {stream, group, worker, 0}
    for j = a, b do args[#args + 1] = ids[j] end
    args[#args + 1] = 'IDLE'
    args[#args + 1] = idle_ms
    args[#args + 1] = 'JUSTID'
    redis.call('XCLAIM', unpack(args))
  end)
end

-- HMGET of many fields, chunked; returns the values in order (false for missing ones).
local function hmget_all(key, fields)
  local out = {}
  each_chunk(#fields, function(a, b)
    local got = redis.call('HMGET', key, unpack(fields, a, b))
    for i = 1, #got do out[#out + 1] = got[i] end
  end)
  return out
end

-- "0-3,7,8,10-12" for a sorted list of integers (runs of three or more as ranges): short text for
-- humans, however many there are: past MISSING_TEXT_CHARS the rest is counted ("... and 812 more"),
-- so an error reason written into every key of a trajectory stays small.
local function ranges(list)
  local parts, i, len = {}, 1, 0
  while i <= #list do
    local j = i
    while j < #list and list[j + 1] == list[j] + 1 do j = j + 1 end
    if len > MISSING_TEXT_CHARS then
      local rest = #list - i + 1
      parts[#parts + 1] = '... and ' .. rest .. ' more'
      break
    end
    local part
    if j >= i + 2 then
      part = list[i] .. '-' .. list[j]
    else
      j = i
      part = tostring(list[i])
    end
    parts[#parts + 1] = part
    len = len + #part + 1
    i = j + 1
  end
  return table.concat(parts, ',')
end

-- Refuse a script before its first write when the ACL user may not run a command it sends after
-- that write (a permission revoked while the worker runs): refused midway, a script keeps the
-- writes made before the refusal (results visible while their entries stay pending). Returns the
-- NOPERM error reply to send back, or nil. Uses Redis 7's redis.acl_check_cmd; without it (an
-- older server, fakeredis) nothing is checked. Work: one check per command, O(1).
local function refused_rights(stream, group, key)
  local check = redis.acl_check_cmd
  if not check then return nil end
  -- one call per command and no table built for it: ~4 us a call here, where a table per check took ~9-13
  local function refused(...)
    local ok, allowed = pcall(check, ...)
    return ok and not allowed
  end
  local name
  if refused('HSET', key, 'f', 'v') then name = 'hset'
  elseif refused('HDEL', key, 'f') then name = 'hdel'
  elseif refused('EXPIRE', key, '1') then name = 'expire'
  elseif refused('DEL', key) then name = 'del'
  elseif refused('RENAME', key, key) then name = 'rename'
  elseif refused('ZREM', key, 'm') then name = 'zrem'
  elseif refused('XACK', stream, group, '0-1') then name = 'xack'
  elseif refused('XDEL', stream, '0-1') then name = 'xdel'
  elseif refused('XADD', stream, '*', 'f', 'v') then name = 'xadd'
  end
  if name then
    return redis.error_reply('NOPERM this user has no permissions to run the \'' .. name ..
                             '\' command (checked before the script wrote anything)')
  end
  return nil
end

-- Acknowledge and delete stream entries: their data lives in the trajectory hash, or
-- their trajectory is finished.
local function ack_delete(stream, group, ids)
  each_chunk(#ids, function(a, b)
    redis.call('XACK', stream, group, unpack(ids, a, b))
    redis.call('XDEL', stream, unpack(ids, a, b))
  end)
end

-- The items of a comma-separated field value (none for a missing field: nil or false).
local function split_list(s)
  local items = {}
  if s then
    for item in string.gmatch(s, '[^,]+') do items[#items + 1] = item end
  end
  return items
end

-- Entry ids recorded in the trajectory hash ("acks" field, comma separated).
local function recorded_acks(traj)
  return split_list(redis.call('HGET', traj, 'acks'))
end

-- Record entry `id` to be acknowledged at commit. Returns false (recording nothing) when the
-- list already holds max_out + ACK_SLACK ids: the caller acknowledges that entry at once (the
-- trajectory's data is in the hash, or in the entries already listed).
local function add_ack(traj, id, max_out)
  local s = redis.call('HGET', traj, 'acks')
  if not s or s == '' then
    redis.call('HSET', traj, 'acks', id)
    return true
  end
  if string.find(',' .. s .. ',', ',' .. id .. ',', 1, true) then return true end
  local _, commas = string.gsub(s, ',', '')
  if commas + 1 >= max_out + ACK_SLACK then return false end
  redis.call('HSET', traj, 'acks', s .. ',' .. id)
  return true
end

-- Entry `id` was recorded with add_ack; when it came with a blob the hash does not keep as output
-- `index`'s record (b:<index>: a duplicate's blob), the blob is recorded too (`ack_blobs`), so the
-- trajectory's end deletes it with the entry (ack_recorded). Bounded as `acks` is: one name per id.
local function add_ack_blob(traj, index, blob)
  if blob == '' or redis.call('HGET', traj, 'b:' .. index) == blob then return end
  local s = redis.call('HGET', traj, 'ack_blobs')
  if not s or s == '' then
    redis.call('HSET', traj, 'ack_blobs', blob)
  elseif not string.find(',' .. s .. ',', ',' .. blob .. ',', 1, true) then
    redis.call('HSET', traj, 'ack_blobs', s .. ',' .. blob)
  end
end

-- An ended trajectory's recorded entries acknowledged and deleted, with the blobs recorded beside
-- them (add_ack_blob); the blobs of its kept records go with `drop_refs`. Work: at most
-- max_out + ACK_SLACK entries and as many blobs, in chunks.
local function ack_recorded(traj, stream, group)
  local got = redis.call('HMGET', traj, 'acks', 'ack_blobs')
  ack_delete(stream, group, split_list(got[1]))
  if not got[2] then return end
  local names = split_list(got[2])
  each_chunk(#names, function(a, b) redis.call('DEL', unpack(names, a, b)) end)
  redis.call('HDEL', traj, 'ack_blobs')
end

-- The highest output index a trajectory is known to have (-1: none): its final index, else the
-- highest stored one (`hi`). A hash without `hi` (written by an older rewardq) is scanned only
-- when it is small enough to hold no more than max_out outputs.
local function highest_index(traj, max_out)
  local final = redis.call('HGET', traj, 'final')
  if final then return tonumber(final) end
  local hi = redis.call('HGET', traj, 'hi')
  if hi then return tonumber(hi) end
  local best = -1
  if redis.call('HLEN', traj) <= max_out + 32 then
    for _, f in ipairs(redis.call('HKEYS', traj)) do
      if string.sub(f, 1, 2) == 'o:' then
        local i = tonumber(string.sub(f, 3))
        if i and i > best then best = i end
      end
    end
  end
  return best
end

-- An error result: why (`msg`), what kind of failure (`kind`, a rewardq.queue.states.FailureKind
-- value) and its reward_extra_info (`extra`: JSON the worker encoded and bounded, holding `error`;
-- '' for the usual {"error": msg}); `latency`: its latency_ms as text ('' when unknown).
local function error_result(msg, kind, extra, provenance, attempt, latency)
  return {msg = msg, kind = kind, extra = extra ~= '' and extra or cjson.encode({error = msg}),
          provenance = provenance or '', attempt = attempt or '', latency = latency or ''}
end

-- Milliseconds from `since` (unix seconds; nil or 0: unknown) to `now`, as a result's latency_ms
-- text ('' when unknown).
local function latency_text(since, now)
  if not since or since <= 0 then return '' end
  return string.format('%.3f', math.max(0, now - since) * 1000)
end

-- The `ts` field (the producer's put time, unix seconds) of a stream entry, or nil.
local function entry_ts(stream, id)
  if id == '' then return nil end
  local e = redis.call('XRANGE', stream, id, id)
  if #e == 0 then return nil end
  local f = e[1][2]
  for j = 1, #f, 2 do
    if f[j] == 'ts' then return tonumber(f[j + 1]) end
  end
  return nil
end

-- Give output key `rkey` the error result `err` (error_result), unless it already has a result
-- (which may be another or a finished trajectory's: never overwritten). Returns 1 when it wrote, else 0.
local function write_error(rkey, err, worker, now, ttl)
  if redis.call('EXISTS', rkey) == 1 then return 0 end
  redis.call('HSET', rkey, 'status', 'error', 'reward_score', '',
             'reward_extra_info', err.extra, 'error', err.msg, 'failure_kind', err.kind,
             'worker', worker, 'manager', '', 'scored_at', string.format('%.6f', now),
             'latency_ms', err.latency, 'provenance', err.provenance, 'attempt', err.attempt)
  if ttl > 0 then redis.call('EXPIRE', rkey, ttl) end
  return 1
end

-- Missing indices of a trajectory still collecting, as a short string for humans.
local function missing_text(traj, max_out)
  local final = redis.call('HGET', traj, 'final')
  local have, seen = {}, {}
  -- a trajectory hash holds o:<i> (or r:<i>, lua/store.lua) and h:<i> (its digest) per stored
  -- output, at most max_out each, plus a few scalar fields
  if redis.call('HLEN', traj) <= 2 * max_out + 32 then
    for _, f in ipairs(redis.call('HKEYS', traj)) do
      local kind = string.sub(f, 1, 2)
      if kind == 'o:' or kind == 'r:' then
        local i = tonumber(string.sub(f, 3))
        if i then
          seen[i] = true
          have[#have + 1] = i
        end
      end
    end
  end
  table.sort(have)
  if not final then
    return 'final output never arrived (have indices ' .. ranges(have) .. ')'
  end
  local miss = {}
  for i = 0, math.min(tonumber(final), max_out - 1) do
    if not seen[i] then miss[#miss + 1] = i end
  end
  return 'missing output indices ' .. ranges(miss) .. ' of 0..' .. final
end

-- Take the trajectory's scoring lease for `worker` in its process life `life` (an id each process
-- draws at start: rewardq.queue.broker), unless another worker holds a live one.
-- Returns the other holder's name when it does; else nil, the trajectory's scoring attempts,
-- this one included (above 1: an earlier lease ended without a commit), and then its earlier
-- starts in a scorer of a reclaimed attempt, alone (`solo`) and side by side (`shared`), both
-- read only when attempts > 1 (see rewardq.consumers.quarantine).
-- A lease this life still holds is the same attempt (another entry of the trajectory it is
-- scoring, filed in the same batch): it is extended, not counted again. A live lease of the same
-- name in another life (`lease_life`) was an earlier process under this name, which died: a name
-- is one consumer of the group, and a restarted process (a StatefulSet pod, a systemd unit) comes
-- back under it. That lease is taken over at once, as a new attempt, so the restart counts as the
-- crash it was; waiting out its lease_until would only delay the redelivery.
local function take_lease(traj, worker, life, now, seconds)
  local held = redis.call('HMGET', traj, 'lease', 'lease_until', 'lease_life')
  local holder, until_ = held[1], tonumber(held[2] or '0')
  if holder and holder ~= worker and until_ > now then
    return holder
  end
  local same = holder == worker and held[3] == life and until_ > now
  redis.call('HSET', traj, 'lease', worker, 'lease_life', life, 'lease_until', string.format('%.6f', now + seconds))
  local attempts
  if same then
    attempts = tonumber(redis.call('HGET', traj, 'attempts') or '1') or 1
  else
    attempts = redis.call('HINCRBY', traj, 'attempts', 1)
  end
  local solo, shared = 0, 0
  if attempts > 1 then
    local c = redis.call('HMGET', traj, 'solo', 'shared')
    solo, shared = tonumber(c[1] or '0') or 0, tonumber(c[2] or '0') or 0
  end
  return nil, attempts, solo, shared
end

-- Whether `worker` in its life `life` holds the trajectory's lease (live or not): what renewing,
-- handing back and ending an attempt unanswered require. An earlier life's lease under the same
-- name is not this life's (take_lease takes it over).
local function holds_lease(traj, worker, life)
  local held = redis.call('HMGET', traj, 'lease', 'lease_life')
  return held[1] == worker and held[2] == life
end

-- The record bytes of a stream entry (nil when the entry is gone).
local function entry_data(stream, id)
  local e = redis.call('XRANGE', stream, id, id)
  if #e == 0 then return nil end
  local f = e[1][2]
  for j = 1, #f, 2 do
    if f[j] == 'data' then return f[j + 1] end
  end
  return nil
end

-- A trajectory claimed whole (lua/claim.lua) keeps its records in the stream until commit;
-- `whole` lists their entry ids in index order (at most max_out of them). Returns that list, or nil.
local function whole_ids(traj)
  local s = redis.call('HGET', traj, 'whole')
  if not s then return nil end
  return split_list(s)
end

-- Records kept in their stream entries (r:<i>, lua/store.lua) end with their trajectory: the
-- entries are deleted and the references dropped. They are not kept in `records` (they are the
-- large ones: over the worker's inline_bytes), and so are their blobs (b:<i>, rewardq/queue/blobs.py).
-- Work: none without `refs`; else at most 2 * max_out fields read, entries and blobs deleted, in chunks.
local function drop_refs(traj, stream, max_out)
  if not redis.call('HGET', traj, 'refs') then return end
  local hi = math.min(highest_index(traj, max_out), max_out - 1)
  local names, ids, blobs = {}, {}, {}
  for i = 0, hi do
    names[#names + 1] = 'r:' .. i
    names[#names + 1] = 'b:' .. i
  end
  local got = hmget_all(traj, names)
  for j = 1, #got, 2 do
    if got[j] then ids[#ids + 1] = got[j] end
    if got[j + 1] then blobs[#blobs + 1] = got[j + 1] end
  end
  each_chunk(#ids, function(a, b) redis.call('XDEL', stream, unpack(ids, a, b)) end)
  each_chunk(#blobs, function(a, b) redis.call('DEL', unpack(blobs, a, b)) end)
  each_chunk(#names, function(a, b) redis.call('HDEL', traj, unpack(names, a, b)) end)
  redis.call('HDEL', traj, 'refs')
end

-- The stored records of an ended trajectory (scored or failed): with keep > 0 they move into
-- `records` for keep seconds (for `rewardq inspect` and `rewardq dead-letters retry`), else they
-- are deleted. Records in the hash move by one RENAME of the hash, whose other fields (digests and
-- a few scalars, at most max_out + 32: refused past 2 * max_out + 32 fields) are then copied back
-- into a new trajectory hash, so no record byte is copied; records of a `whole` trajectory (still
-- in the stream, deleted with their entries) are copied, up to KEEP_COPY_BYTES.
-- Records kept in their stream entries are deleted with them (`drop_refs`).
-- Work: at most 2 * max_out + 32 hash fields, one RENAME, or KEEP_COPY_BYTES copied, plus `drop_refs`.
local function end_records(traj, stream, records, keep, max_out)
  local ids = whole_ids(traj)
  if ids then
    if keep > 0 then
      redis.call('DEL', records)
      local copied = 0
      for i, id in ipairs(ids) do
        if copied >= KEEP_COPY_BYTES then break end
        local data = entry_data(stream, id)
        if data then
          redis.call('HSET', records, 'o:' .. (i - 1), data)
          copied = copied + #data
        end
      end
      if copied > 0 then redis.call('EXPIRE', records, math.ceil(keep)) end
    end
    redis.call('HDEL', traj, 'whole')
    return
  end
  drop_refs(traj, stream, max_out)
  local hi = math.min(highest_index(traj, max_out), max_out - 1)
  if keep > 0 and hi >= 0 and redis.call('HLEN', traj) <= 2 * max_out + 32 then
    local meta, has_records = {}, false
    for _, f in ipairs(redis.call('HKEYS', traj)) do
      if string.sub(f, 1, 2) == 'o:' then has_records = true else meta[#meta + 1] = f end
    end
    if has_records then
      local values = hmget_all(traj, meta)
      redis.call('DEL', records)
      redis.call('RENAME', traj, records)
      each_chunk(#meta, function(a, b) redis.call('HDEL', records, unpack(meta, a, b)) end)
      local pairs_ = {}
      for j = 1, #meta do
        pairs_[#pairs_ + 1] = meta[j]
        pairs_[#pairs_ + 1] = values[j]
      end
      each_chunk(#pairs_, function(a, b) redis.call('HSET', traj, unpack(pairs_, a, b)) end)
      redis.call('EXPIRE', records, math.ceil(keep))
      return
    end
  end
  local fields = {}
  for i = 0, hi do fields[#fields + 1] = 'o:' .. i end
  each_chunk(#fields, function(a, b) redis.call('HDEL', traj, unpack(fields, a, b)) end)
end

-- Finish a trajectory with the error result `err` (error_result) for every key it answers for:
-- 0 .. its highest known index (and `extra`, the index a failing record named), never past
-- max_out - 1; an `extra` index at or past max_out gets its own key's error alone (`extra_text`
-- spells it: no float formatting). Keys that already have a result keep it. Its stored records end
-- as a scored trajectory's do (`end_records`: kept in `records` for keep seconds, else deleted).
-- `err.msg` is at most ~1 KB and `err.extra` a few KB (the worker cuts reasons to
-- rewardq.queue.text.MAX_REASON_BYTES and bounds the extra info; the reasons written here are short).
-- Work: at most max_out + 1 keys written, plus `end_records`. Returns the indexes of the keys it
-- wrote, as text, in order (at most max_out + 1 of them): the worker's ledger rows follow them.
local function finish_error(traj, stream, waiting, done, records, group, tid, rprefix, ttl, err,
                            worker, extra, extra_text, maxlen, now, max_out, keep)
  local hi = math.min(highest_index(traj, max_out), max_out - 1)
  if extra and extra >= 0 and extra < max_out and extra > hi then hi = extra end
  local wrote = {}
  for i = 0, hi do
    if write_error(rprefix .. tid .. '_' .. i, err, worker, now, ttl) == 1 then wrote[#wrote + 1] = tostring(i) end
  end
  if extra and extra >= max_out and string.match(extra_text or '', '^%d+$') then
    if write_error(rprefix .. tid .. '_' .. extra_text, err, worker, now, ttl) == 1 then
      wrote[#wrote + 1] = extra_text
    end
  end
  end_records(traj, stream, records, keep, max_out)
  redis.call('HSET', traj, 'state', 'done', 'status', 'error', 'error', err.msg, 'failure_kind', err.kind,
             'worker', worker, 'done_at', string.format('%.6f', now), 'n', hi + 1)
  redis.call('HDEL', traj, 'lease', 'lease_until', 'lease_life')
  if ttl > 0 then redis.call('EXPIRE', traj, ttl) end
  redis.call('ZREM', waiting, tid)
  ack_recorded(traj, stream, group)
  redis.call('XADD', done, 'MAXLEN', '~', maxlen, '*', 'tid', tid, 'n', hi + 1, 'status', 'error')
  return wrote
end

-- A script call sent again after its reply was lost (rewardq.queue.retry: a resend) must answer
-- what the first run answered, which has since changed what a second run would see. So `fail`
-- keeps its reply in the trajectory hash under the caller's per-call nonce (`reply:<nonce>`, the
-- reply as JSON: at most max_out + 3 short texts) and a resend with that nonce gets it back and
-- does nothing more. At most KEPT_REPLIES are kept per trajectory (`replies` lists their nonces,
-- oldest first; a resend follows its first try within seconds); they expire with the hash.
local KEPT_REPLIES = 8
local function kept_reply(traj, nonce)
  if nonce == '' then return nil end
  local s = redis.call('HGET', traj, 'reply:' .. nonce)
  if not s then return nil end
  return cjson.decode(s)
end
local function keep_reply(traj, nonce, reply)
  if nonce == '' then return end
  local names = split_list(redis.call('HGET', traj, 'replies'))
  names[#names + 1] = nonce
  local drop = {}
  for j = 1, #names - KEPT_REPLIES do drop[#drop + 1] = 'reply:' .. names[j] end
  if #drop > 0 then
    each_chunk(#drop, function(a, b) redis.call('HDEL', traj, unpack(drop, a, b)) end)
    names = {unpack(names, #drop + 1)}
  end
  redis.call('HSET', traj, 'reply:' .. nonce, cjson.encode(reply), 'replies', table.concat(names, ','))
end

-- Add a dead letter (`fields`: its field/value list, a few dozen values) to stream `dead`, then
-- keep the stream within its bounds: at most `maxlen` entries, at most `max_bytes` bytes of field
-- names and values (counted in field `n` of hash `dead .. ':bytes'`, of the same slot), nothing older than
-- `ttl_ms`; the oldest entries go first, the one just added stays. Both keys expire `ttl_ms` after
-- the last dead letter. Budget: at most DEAD_TRIM entries removed per call (a later call removes
-- the rest; each dead letter is itself bounded by the worker, so the bound is overshot by at most
-- DEAD_TRIM small entries' worth).
local DEAD_TRIM = 256
local function entry_bytes(fields)
  local size = 0
  for j = 1, #fields do size = size + #fields[j] end
  return size
end
local function add_dead(dead, fields, maxlen, max_bytes, ttl_ms)
  local counter = dead .. ':bytes'
  local added = redis.call('XADD', dead, '*', unpack(fields))
  local total = redis.call('HINCRBY', counter, 'n', entry_bytes(fields))
  local t = redis.call('TIME')
  local cutoff = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - ttl_ms
  for _ = 1, DEAD_TRIM do
    local oldest = redis.call('XRANGE', dead, '-', '+', 'COUNT', 1)
    if #oldest == 0 or oldest[1][1] == added then break end
    local ms = tonumber(string.match(oldest[1][1], '^(%d+)'))
    if total <= max_bytes and ms >= cutoff and redis.call('XLEN', dead) <= maxlen then break end
    redis.call('XDEL', dead, oldest[1][1])
    total = redis.call('HINCRBY', counter, 'n', -entry_bytes(oldest[1][2]))
    if total < 0 then  -- dead letters from before the count existed: count from here on
      redis.call('HSET', counter, 'n', 0)
      total = 0
    end
  end
  if redis.call('XLEN', dead) <= 1 then redis.call('HSET', counter, 'n', entry_bytes(fields)) end
  redis.call('PEXPIRE', dead, ttl_ms)
  redis.call('PEXPIRE', counter, ttl_ms)
  return added
end
