-- unfinished: a worker's attempt at a trajectory ended without an answer (its commit failed, say):
-- count it and keep why, so that a dead letter for running out of deliveries says what happened
-- instead of guessing a crash; and drop the worker's lease, so the next attempt (by any worker)
-- starts at once and counts as a new one.
-- KEYS: traj   ARGV: worker, why (the worker cut it to ~500 bytes), life (the worker's process life)
-- Budget: O(1).
local traj, worker, why, life = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
if redis.call('EXISTS', traj) == 0 or redis.call('HGET', traj, 'state') == 'done' then return 0 end
-- Only the attempt holding the lease is counted: a call resent after its reply was lost (the lease
-- already dropped), or from a process life whose lease another took over, changes nothing.
if not holds_lease(traj, worker, life) then return 0 end
redis.call('HDEL', traj, 'lease', 'lease_until', 'lease_life')
redis.call('HINCRBY', traj, 'unfinished', 1)
redis.call('HSET', traj, 'last_failure', why)
return 1
