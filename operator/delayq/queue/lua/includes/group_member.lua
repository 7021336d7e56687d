-- A `wait` member: the group, its due (16 digits: lexical order is due order) and the id,
-- '\0' between them (a group never holds one: codec.validate_group).
local function group_member(group, due, id)
  return group .. '\0' .. string.format('%016d', due) .. '\0' .. id
end
