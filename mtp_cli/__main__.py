from mtp_cli.cli import main

main()
