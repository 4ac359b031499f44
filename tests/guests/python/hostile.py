"""A hostile tenant component in Python, for the end-to-end tests: the request parameter
`mode` picks the behaviour: `bomb` grows a list until memory runs out, `loop` spins forever,
`raise` fails with an exception of its own, anything else answers an empty response."""

import sluice_guest as sg


def infer(request):
    mode = request.parameters.get("mode", "")
    if mode == "bomb":
        hoard = []
        while True:
            hoard.append(bytearray(1 << 20))
    if mode == "loop":
        count = 0
        while True:
            count += 1
    if mode == "raise":
        raise KeyError("no such thing")
    return []


Handler = sg.handler(infer)
