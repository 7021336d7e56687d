-- Append a lifecycle event to the slot's journal stream (fields e, id, t, due, a); off at 0.
local function journal(key, maxlen, event, id, now, due, attempts)
  if maxlen > 0 then
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*',
      'e', event, 'id', id, 't', now, 'due', due, 'a', attempts)
  end
end
