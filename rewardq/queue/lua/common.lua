-- Shared helpers, prepended to every rewardq script (see rewardq/queue/scripts.py).
-- Every key a script touches carries the shard's hash tag, so one script = one slot.

local function now_seconds()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- Acknowledge and delete stream entries: their data lives in the trajectory hash, or
-- their trajectory is finished.
local function ack_delete(stream, group, ids)
  if #ids > 0 then
    redis.call('XACK', stream, group, unpack(ids))
    redis.call('XDEL', stream, unpack(ids))
  end
end

-- Entry ids recorded in the trajectory hash ("acks" field, comma separated).
local function recorded_acks(traj)
  local ids = {}
  local s = redis.call('HGET', traj, 'acks')
  if s then
    for id in string.gmatch(s, '[^,]+') do ids[#ids + 1] = id end
  end
  return ids
end

local function add_ack(traj, id)
  local s = redis.call('HGET', traj, 'acks')
  if not s or s == '' then
    redis.call('HSET', traj, 'acks', id)
  elseif not string.find(',' .. s .. ',', ',' .. id .. ',', 1, true) then
    redis.call('HSET', traj, 'acks', s .. ',' .. id)
  end
end

-- The indices a finished-with-error trajectory must answer for: every stored output,
-- 0..final when the final index is known (else 0..highest seen), and `extra`.
local function known_indices(traj, extra)
  local hi = -1
  local final = redis.call('HGET', traj, 'final')
  if final then
    hi = tonumber(final)
  else
    local keys = redis.call('HKEYS', traj)
    for _, f in ipairs(keys) do
      if string.sub(f, 1, 2) == 'o:' then
        local i = tonumber(string.sub(f, 3))
        if i and i > hi then hi = i end
      end
    end
  end
  if extra and extra > hi then hi = extra end
  return hi
end

local function write_error(rkey, msg, worker, now, ttl)
  redis.call('DEL', rkey)
  redis.call('HSET', rkey, 'status', 'error', 'reward_score', '',
             'reward_extra_info', cjson.encode({error = msg}), 'error', msg,
             'worker', worker, 'manager', '', 'scored_at', string.format('%.6f', now),
             'latency_ms', '')
  if ttl > 0 then redis.call('EXPIRE', rkey, ttl) end
end

-- Missing indices of a trajectory still collecting, as a string for humans.
local function missing_text(traj)
  local final = redis.call('HGET', traj, 'final')
  local have = {}
  local keys = redis.call('HKEYS', traj)
  local seen = {}
  for _, f in ipairs(keys) do
    if string.sub(f, 1, 2) == 'o:' then
      local i = tonumber(string.sub(f, 3))
      seen[i] = true
      have[#have + 1] = i
    end
  end
  table.sort(have)
  if not final then
    return 'final output never arrived (have indices ' .. table.concat(have, ',') .. ')'
  end
  local miss = {}
  for i = 0, tonumber(final) do
    if not seen[i] then miss[#miss + 1] = i end
  end
  return 'missing output indices ' .. table.concat(miss, ',') .. ' of 0..' .. final
end

-- Take the trajectory's scoring lease for `worker`, unless another worker holds a live one.
-- Returns the other holder's name when it does; else nil and the trajectory's scoring
-- attempts, this one included (above 1: an earlier lease ended without a commit).
local function take_lease(traj, worker, now, seconds)
  local holder = redis.call('HGET', traj, 'lease')
  local until_ = tonumber(redis.call('HGET', traj, 'lease_until') or '0')
  if holder and holder ~= worker and until_ > now then
    return holder
  end
  redis.call('HSET', traj, 'lease', worker, 'lease_until', string.format('%.6f', now + seconds))
  return nil, redis.call('HINCRBY', traj, 'attempts', 1)
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
-- `whole` lists their entry ids in index order. Returns that list, or nil.
local function whole_ids(traj)
  local s = redis.call('HGET', traj, 'whole')
  if not s then return nil end
  local ids = {}
  for id in string.gmatch(s, '[^,]+') do ids[#ids + 1] = id end
  return ids
end

-- Turn a whole trajectory into an ordinary one: copy its records into the hash (o:<i>).
local function materialize(traj, stream)
  local ids = whole_ids(traj)
  if not ids then return end
  for i, id in ipairs(ids) do
    local data = entry_data(stream, id)
    if data then redis.call('HSET', traj, 'o:' .. (i - 1), data) end
  end
  redis.call('HDEL', traj, 'whole')
end

-- Finish a trajectory with an error for every key it answers for. Payloads are kept
-- (until the hash expires) so `rewardq dead-letters retry` can score it again.
local function finish_error(traj, stream, waiting, done, group, tid, rprefix, ttl, msg,
                            worker, extra, maxlen, now)
  materialize(traj, stream)  -- keep the records for `rewardq dead-letters retry`
  local hi = known_indices(traj, extra)
  for i = 0, hi do
    write_error(rprefix .. tid .. '_' .. i, msg, worker, now, ttl)
  end
  redis.call('HSET', traj, 'state', 'done', 'status', 'error', 'error', msg, 'worker', worker,
             'done_at', string.format('%.6f', now), 'n', hi + 1)
  redis.call('HDEL', traj, 'lease', 'lease_until')
  if ttl > 0 then redis.call('EXPIRE', traj, ttl) end
  redis.call('ZREM', waiting, tid)
  ack_delete(stream, group, recorded_acks(traj))
  redis.call('XADD', done, 'MAXLEN', '~', maxlen, '*', 'tid', tid, 'n', hi + 1, 'status', 'error')
  return hi + 1
end
