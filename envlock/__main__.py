from envlock.commands import console_main

console_main()
