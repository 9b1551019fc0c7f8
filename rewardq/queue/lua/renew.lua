-- renew: this worker (this life of it) is still scoring these trajectories: extend its leases, and reset the
-- idle time of their pending entries (XCLAIM ... JUSTID does not count a delivery) so no
-- other worker reclaims them while we are alive.
-- KEYS: stream, traj...   ARGV: group, worker, lease_seconds, life
-- Returns how many leases were still ours (this life's: see take_lease in common.lua).
-- Budget: one XCLAIM per trajectory given (the worker's in-flight ones) of its recorded entries
-- (at most max_outputs + 16 each, capped where they are recorded).
local stream, group, worker, lease, life = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now = now_seconds()
local n = 0
for k = 2, #KEYS do
  local traj = KEYS[k]
  if holds_lease(traj, worker, life) then
    redis.call('HSET', traj, 'lease_until', string.format('%.6f', now + lease))
    touch_entries(stream, group, worker, recorded_acks(traj), 0)
    n = n + 1
  end
end
return n
