"""The bytecode machine: frames, the loop over their instructions, and one handler per opcode
(loads and stores, operators, building, jumps, loops, yields, ``match``, ``with``, calls)."""
