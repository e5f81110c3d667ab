from grassflow.bench import main

main()
