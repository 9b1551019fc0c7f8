-- beat: a worker's heartbeat: its snapshot hash (KEYS[1], kept ttl seconds), or its name's score
-- in the fleet's sorted set of workers (KEYS[1], when ARGV[1] is 'member').
-- KEYS: key   ARGV: 'hash', ttl, field, value, ...   or   'member', name, score
-- Returns, for a hash, the process life the hash named before this beat (false: none), so that a
-- process whose name another live process also beats under finds out (rewardq.queue.liveness).
-- Budget: one hash of the worker's counters (a few KB: its snapshot bounds every list it holds),
-- or one member. Flags: allow-oom (rewardq/queue/scripts.py): a heartbeat refused past maxmemory
-- would make a live worker look dead to the fleet, for a few KB.
if ARGV[1] == 'member' then
  return redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
end
local before = redis.call('HGET', KEYS[1], 'life')
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return before
