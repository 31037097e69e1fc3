-- A cancelled run whose sagas must compensate reached a fan-out some of whose
-- branches wait (a timer, a signal, a call, a child): their waits end here,
-- and the caller sends those branches again, to meet the cancellation where
-- they wait and compensate what they did before the run settles.
-- KEYS[1] run hash, KEYS[2] waits
-- ARGV[1] epoch, ARGV[2] fan-out call "<seq>:<i>"
-- Returns {'ok', cancel, pause, limit, j, j, ...} (the branches whose waits
-- ended) or {refusal}.
local prefix = ARGV[2] .. '/'
local entries = redis.call('HGETALL', KEYS[2])
local seen, out, summarized = {}, {}, false
for i = 1, #entries, 2 do
  local ok, wait = pcall(cjson.decode, entries[i + 1])
  local owner = ok and type(wait) == 'table' and tostring(wait['owner']) or ''
  if string.sub(owner, 1, #prefix) == prefix then
    redis.call('HDEL', KEYS[2], entries[i])
    summarized = summarized or wait['kind'] ~= 'call'
    local branch = string.sub(owner, #prefix + 1)
    if not seen[branch] then
      seen[branch] = true
      table.insert(out, tonumber(branch))
    end
  end
end
if summarized then refresh_waiting(KEYS[1], KEYS[2]) end
local f = flags(KEYS[1])
local reply = {'ok', f[1], f[2], f[3]}
for _, branch in ipairs(out) do table.insert(reply, branch) end
return reply
