-- deadletter: dead-letter an entry that names no trajectory at all, and acknowledge it.
-- KEYS: dead, stream
-- ARGV: group, entry_id, dead_maxlen, dead_bytes, dead_ttl_ms, then dead-letter field/value pairs
-- Budget: one dead letter (its fields cut by the worker), the stream then trimmed by add_dead.
local dead, stream = KEYS[1], KEYS[2]
local group, id = ARGV[1], ARGV[2]
local maxlen, max_bytes, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local fields = {}
for j = 6, #ARGV do fields[#fields + 1] = ARGV[j] end
add_dead(dead, fields, maxlen, max_bytes, ttl)
ack_delete(stream, group, {id})
return 1
