-- release: hand trajectories back (graceful shutdown): drop our lease and mark their pending
-- entries as long idle, so the next worker's reclaim picks them up at once. The attempt the
-- lease counted is taken back: a trajectory handed back is not suspected of crashing workers; the
-- hand-back is counted instead (`handbacks`), so running out of deliveries can say why.
-- KEYS: stream, traj...   ARGV: group, worker, idle_ms, life (only this life's leases are handed back)
-- Budget: one XCLAIM per trajectory given (the worker's in-flight ones) of its recorded entries
-- (at most max_outputs + 16 each, capped where they are recorded).
local stream, group, worker, idle, life = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = 0
for k = 2, #KEYS do
  local traj = KEYS[k]
  if holds_lease(traj, worker, life) then
    redis.call('HDEL', traj, 'lease', 'lease_until', 'lease_life')
    redis.call('HINCRBY', traj, 'attempts', -1)  -- handed back unfinished, not died: not an attempt
    redis.call('HINCRBY', traj, 'handbacks', 1)  -- but counted, for the reason of a dead letter
    touch_entries(stream, group, worker, recorded_acks(traj), idle)
    n = n + 1
  end
end
return n
