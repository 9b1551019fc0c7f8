-- Replace the scoring configuration a namespace records, if it is still the one the caller saw.
-- KEYS[1] <ns>:meta
-- ARGV[1] the field ("scoring"), ARGV[2] the value the caller saw ("" for none), ARGV[3] the new value
-- Returns the value recorded afterwards: ARGV[3] when replaced, else what another process wrote.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur == false and ARGV[2] == '') or cur == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return ARGV[3]
end
return cur
