from datastar_py import action_generator as action
from datastar_py import attribute_generator as data
from datastar_py.attributes import JSExpression as JS

payload = {"tab": JS("$tab"), "op": JS("$op"), "title": JS("$new_title")}
send = action.post("/cards", payload=payload, request_cancellation="disabled")
# @post("/cards", {"payload": {"tab": ($tab), "op": ($op), "title": ($new_title)}, ...})
pending = data.class_(pending="$new_op == $op && $op != $done")
# {"data-class": '{"pending": ($new_op == $op && $op != $done)}'}
